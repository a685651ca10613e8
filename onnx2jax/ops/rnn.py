"""Recurrent layers: RNN, GRU and LSTM as one ``lax.scan`` per direction.

The input projection ``X @ W^T + Wb`` is computed for all time steps at once;
the scan carries only the recurrent part. ``sequence_lens`` masks steps past a
batch entry's length (its state stops changing and its Y rows are zero), and
the reverse direction reads each entry's valid prefix backwards.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from onnx2jax.ops.registry import register

# name -> (function(x, alpha, beta), default alpha, default beta)
_ACTIVATIONS = {
    "relu": (lambda x, a, b: jnp.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: jnp.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: jax.nn.sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: jnp.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: jnp.where(x > a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * jnp.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: jnp.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: jnp.where(x >= 0, x, a * (jnp.exp(x) - 1)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + jnp.abs(x)), None, None),
    "softplus": (lambda x, a, b: jnp.logaddexp(x, 0), None, None),
}


def _activations(names, alphas, betas, defaults, num_directions):
    """One list of activation callables per direction."""
    names = list(names) if names else list(defaults) * num_directions
    if len(names) == len(defaults):
        names = names * num_directions
    alphas, betas = list(alphas or ()), list(betas or ())
    fns = []
    for name in names:
        key = name.lower()
        if key not in _ACTIVATIONS:
            raise ValueError(f"unknown activation {name!r}")
        fn, alpha, beta = _ACTIVATIONS[key]
        if alpha is not None and alphas:
            alpha = alphas.pop(0)
        if beta is not None and betas:
            beta = betas.pop(0)
        fns.append(lambda x, fn=fn, a=alpha, b=beta: fn(x, a, b))
    per = len(defaults)
    return [fns[d * per : (d + 1) * per] for d in range(num_directions)]


def _reverse_time(a, lens):
    """Reverses axis 0 (time) of ``a`` [T, B, ...] within each batch entry's valid length.

    With lens = [3, 1] and T = 4: entry 0 reads times 2,1,0,3 and entry 1 reads 0,1,2,3.
    """
    if lens is None:
        return jnp.flip(a, 0)
    t = jnp.arange(a.shape[0])[:, None]
    idx = jnp.where(t < lens[None, :], lens[None, :] - 1 - t, t)
    idx = idx.reshape(idx.shape + (1,) * (a.ndim - 2))
    return jnp.take_along_axis(a, idx, axis=0)


def _scan_direction(step, xw, states, lens, reverse):
    """Runs ``step(states, xw_t) -> states`` over time; returns (Y [T, B, H], final states)."""
    if reverse:
        xw = _reverse_time(xw, lens)
    steps = xw.shape[0]
    mask = None if lens is None else (jnp.arange(steps)[:, None] < lens[None, :])

    def body(carry, inputs):
        xw_t, m_t = inputs
        new = step(carry, xw_t)
        if m_t is None:
            return new, new[0]
        keep = m_t[:, None]
        new = tuple(jnp.where(keep, n, c) for n, c in zip(new, carry))
        return new, jnp.where(keep, new[0], jnp.zeros_like(new[0]))

    finals, ys = jax.lax.scan(body, tuple(states), (xw, mask))
    if reverse:
        ys = _reverse_time(ys, lens)
    return ys, finals


def _clip(clip):
    if clip is None:
        return lambda v: v
    return lambda v: jnp.clip(v, -clip, clip)


def _run(x, w, r, b, sequence_lens, initial_states, *, gates, direction, layout, make_step):
    """Shared driver: layouts, directions, biases, sequence lengths.

    ``make_step(d, w_bias, r_weights, r_bias) -> step`` builds one direction's cell.
    Returns (Y, [final state per kind]) in the node's layout.
    """
    x = jnp.asarray(x)
    if layout:
        x = jnp.swapaxes(x, 0, 1)  # [batch, seq, in] -> [seq, batch, in]
    num_dir = 2 if direction == "bidirectional" else 1
    hidden = jnp.shape(r)[-1]
    batch = x.shape[1]
    dtype = x.dtype
    if b is None:
        b = jnp.zeros((num_dir, 2 * gates * hidden), dtype)
    lens = None if sequence_lens is None else jnp.asarray(sequence_lens).astype(jnp.int32)
    ys, finals = [], []
    for d in range(num_dir):
        w_bias, r_bias = b[d, : gates * hidden], b[d, gates * hidden :]
        xw = jnp.einsum("tbi,gi->tbg", x, w[d]) + w_bias
        states = []
        for init in initial_states:
            if init is None:
                states.append(jnp.zeros((batch, hidden), dtype))
            else:
                init = jnp.asarray(init)
                states.append(init[:, d] if layout else init[d])
        reverse = direction == "reverse" or d == 1
        y, final = _scan_direction(make_step(d, w_bias, r[d], r_bias), xw, states, lens, reverse)
        ys.append(y)
        finals.append(final)
    y = jnp.stack(ys, axis=1)  # [seq, dir, batch, hidden]
    stacked = [jnp.stack([f[k] for f in finals], axis=0) for k in range(len(initial_states))]
    if layout:
        y = jnp.transpose(y, (2, 0, 1, 3))  # [batch, seq, dir, hidden]
        stacked = [jnp.swapaxes(s, 0, 1) for s in stacked]
    return y, stacked


@register("RNN", 1, 7, 14, 22)
def rnn(
    x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
    activations, clip=None, direction, hidden_size=None, layout=0, output_sequence=0,
):
    num_dir = 2 if direction == "bidirectional" else 1
    acts = _activations(activations, activation_alpha, activation_beta, ["Tanh"], num_dir)
    clipped = _clip(clip)

    def make_step(d, w_bias, rw, r_bias):
        (f,) = acts[d]

        def step(states, xw_t):
            (h,) = states
            return (f(clipped(xw_t + h @ rw.T + r_bias)),)

        return step

    y, (y_h,) = _run(
        x, w, r, b, sequence_lens, [initial_h], gates=1, direction=direction, layout=layout, make_step=make_step
    )
    return y, y_h


@register("GRU", 1, 3, 7, 14, 22)
def gru(
    x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
    activations=None, clip=None, direction, hidden_size=None, layout=0, linear_before_reset=0,
    output_sequence=0,
):
    num_dir = 2 if direction == "bidirectional" else 1
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh"], num_dir)
    clipped = _clip(clip)

    def make_step(d, w_bias, rw, r_bias):
        f, g = acts[d]
        hidden = rw.shape[-1]
        rz, rr, rh = rw[:hidden], rw[hidden : 2 * hidden], rw[2 * hidden :]
        bz, br, bh = r_bias[:hidden], r_bias[hidden : 2 * hidden], r_bias[2 * hidden :]

        def step(states, xw_t):
            (h,) = states
            xz, xr, xh = xw_t[:, :hidden], xw_t[:, hidden : 2 * hidden], xw_t[:, 2 * hidden :]
            z = f(clipped(xz + h @ rz.T + bz))
            reset = f(clipped(xr + h @ rr.T + br))
            if linear_before_reset:
                candidate = g(clipped(xh + reset * (h @ rh.T + bh)))
            else:
                candidate = g(clipped(xh + (reset * h) @ rh.T + bh))
            return ((1 - z) * candidate + z * h,)

        return step

    y, (y_h,) = _run(
        x, w, r, b, sequence_lens, [initial_h], gates=3, direction=direction, layout=layout, make_step=make_step
    )
    return y, y_h


@register("LSTM", 1, 7, 14, 22)
def lstm(
    x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, activation_alpha=None,
    activation_beta=None, activations=None, clip=None, direction, hidden_size=None, input_forget,
    layout=0, output_sequence=0,
):
    num_dir = 2 if direction == "bidirectional" else 1
    acts = _activations(activations, activation_alpha, activation_beta, ["Sigmoid", "Tanh", "Tanh"], num_dir)
    clipped = _clip(clip)

    def make_step(d, w_bias, rw, r_bias):
        f, g, h_act = acts[d]
        hidden = rw.shape[-1]
        if p is None:
            pi = po = pf = 0
        else:
            peep = jnp.asarray(p)[d]
            pi, po, pf = peep[:hidden], peep[hidden : 2 * hidden], peep[2 * hidden :]

        def step(states, xw_t):
            h, c = states
            gates = xw_t + h @ rw.T + r_bias  # order i, o, f, c
            gi, go, gf, gc = (gates[:, k * hidden : (k + 1) * hidden] for k in range(4))
            i = f(clipped(gi + pi * c))
            forget = 1 - i if input_forget else f(clipped(gf + pf * c))  # input_forget couples the gates
            c_new = forget * c + i * g(clipped(gc))
            o = f(clipped(go + po * c_new))
            return o * h_act(c_new), c_new

        return step

    y, (y_h, y_c) = _run(
        x, w, r, b, sequence_lens, [initial_h, initial_c], gates=4, direction=direction, layout=layout,
        make_step=make_step,
    )
    return y, y_h, y_c
