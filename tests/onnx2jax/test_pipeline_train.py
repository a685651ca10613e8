"""Pipelines that train (issue 32): schedules as data, and gradients through stages equal to the single program.

References: torch autograd's gradients of tiny Llama
(tests/data/tiny_llama.torch_grads.npz, ``sum(logits * w)``, which sums over
the batch), the single SPMD program of the unstaged model
(``Compiled.value_and_grad``, one ``jax.value_and_grad``), onnxruntime for
the written-back model, and for schedules the textbook bubble
``(S-1)/(M+S-1)`` and memory bounds (GPipe holds M micro-batches, 1F1B at
most S - s on stage s).

Default suite: the schedule checks (no jax), and tiny Llama in 2 stages x
TP 2 on 4 devices under every schedule, 2 steps of SGD with momentum and of Adam
(train_step and nnx.Optimizer with per_device_group) against the same steps on the unstaged model. The zoo's decoders at
2 and 4 stages, alone and with TP 2, are ``slow``.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import onnx
import optax
import pytest
from train_helpers import ort_outputs
from zoo_cases import ZOO

import onnx2jax
from onnx2jax.errors import NotDifferentiableError, ParameterError, PipelineJitError, ScheduleError
from onnx2jax.runtime import pipeline_schedules as ps
from onnx2jax.runtime.pipeline import PipelineCompiled
from onnx2jax.runtime.spmd import Compiled
from onnx2jax.runtime.train_step import train_step
from sharding.annotate import add_configuration, set_stage
from sharding.stages import StageAssignment, annotate_stages, auto_stages

DATA = Path(__file__).resolve().parents[1] / "data"
LLAMA = DATA / "tiny_llama.onnx"
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b", "zero-bubble")


def staged(path: Path, stages: int, tp: int) -> onnx.ModelProto:
    """The model cut by auto:S; with TP, S groups of ``tp`` devices with Megatron inside each."""
    model = onnx.load(path)
    stage_of, _ = auto_stages(model, stages)
    if tp == 1:
        add_configuration(model, "pp", stages)
        for node, stage in stage_of.items():
            set_stage(model, node, stage, "pp")
        return model
    return annotate_stages(model, StageAssignment.one_group_per_stage(stage_of), stages * tp, "pp", tensor_parallel=True)


# ---------------------------------------------------------------------------
# Schedules as data (no jax)
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(("stages", "microbatches"), [(2, 4), (4, 4), (4, 8)])
def test_built_schedules_meet_their_bubble_and_memory_bounds(stages, microbatches):
    ranks = list(range(stages))
    gpipe, one = (ps.simulate(ps.build(n, ranks, microbatches)) for n in ("gpipe", "1f1b"))
    bound = (stages - 1) / (microbatches + stages - 1)
    assert gpipe.bubble == pytest.approx(bound) and one.bubble == pytest.approx(bound)
    assert gpipe.peak_held == (microbatches,) * stages
    assert one.peak_held == tuple(min(microbatches, stages - s) for s in range(stages))
    zero = ps.simulate(ps.build("zero-bubble", ranks, microbatches))
    assert zero.peak_held == one.peak_held  # ZB-H1 keeps 1F1B's memory ...
    assert ps.analytic_bubble("zero-bubble", stages, microbatches) <= zero.bubble < one.bubble  # ... and a smaller bubble


def test_interleaved_1f1b_over_virtual_stages_shrinks_the_bubble():
    ranks, virtual, microbatches = 4, 2, 8
    schedule = ps.build("interleaved-1f1b", [s % ranks for s in range(ranks * virtual)], microbatches)
    timed = ps.simulate(schedule)
    plain = ps.simulate(ps.build("1f1b", list(range(ranks)), microbatches))
    assert ps.analytic_bubble("interleaved-1f1b", ranks, microbatches, virtual) <= timed.bubble < plain.bubble
    assert all(a.stage % ranks == r for r, actions in enumerate(schedule.ranks) for a in actions)
    with pytest.raises(ScheduleError, match=r"micro-batches \(6\) must be a multiple of the ranks \(4\)"):
        ps.build("interleaved-1f1b", [s % ranks for s in range(ranks * virtual)], 6)
    with pytest.raises(ScheduleError, match="'1f1b' runs one stage per rank.*use 'interleaved-1f1b'"):
        ps.build("1f1b", [s % ranks for s in range(ranks * virtual)], 8)


def test_built_schedules_carry_sends_and_receives():
    schedule = ps.build("1f1b", [0, 1], 2)
    assert [str(a) for a in schedule.ranks[1][:2]] == ["RECV_F(stage 1, micro-batch 0)", "F(stage 1, micro-batch 0)"]
    kinds = {a.kind for rank in schedule.ranks for a in rank}
    assert kinds == {"F", "B", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}
    split = ps.build("zero-bubble", [0, 1], 2)
    assert {a.kind for rank in split.ranks for a in rank} == {"F", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"}


@pytest.mark.parametrize(
    ("ranks", "options", "message"),
    [
        ([["B0.0", "F0.0"], ["F1.0", "B1.0"]], {}, r"rank 0 runs B\(stage 0, micro-batch 0\) before F\(stage 0, micro-batch 0\)"),
        ([["F0.0", "B0.0"], ["B1.0", "F1.0"]], {}, r"rank 1 runs B\(stage 1, micro-batch 0\) before F\(stage 1, micro-batch 0\)"),
        ([["F0.0", "F0.1", "B0.0", "B0.1"], ["F1.0", "B1.0", "F1.1", "B1.1"]], {"memory_bound": 1},
         r"at F\(stage 0, micro-batch 1\) rank 0 holds 2 micro-batches' residuals, over its memory bound of 1"),
        ([["F0.0", "B0.0"], ["F1.0"]], {}, r"never runs B\(stage 1, micro-batch 0\)"),
        ([["F0.0", "B0.0", "F1.0"], ["B1.0"]], {}, r"F\(stage 1, micro-batch 0\) is on rank 0, but stage 1 runs on rank 1"),
        ([["F0.0", "X0.0"]], {}, "unknown action kind 'X'"),
        ([["F0.0", "F0.0", "B0.0"]], {}, "is repeated"),
        ([["F0.0", "I0.0", "B0.0"]], {}, "mixes B with I and W"),
        ([["F0.0", "I0.0"]], {}, r"never runs W\(stage 0, micro-batch 0\)"),
        ([["F0.0", "W0.0", "I0.0"]], {}, r"runs W\(stage 0, micro-batch 0\) before I\(stage 0, micro-batch 0\)"),
        ([["F0.0", "SEND_F0.0", "B0.0"], ["F1.0", "B1.0"]], {}, r"SEND_F\(stage 0, micro-batch 0\) has no matching RECV_F"),
        ([["F0.x"]], {}, "cannot read action 'F0.x'"),
    ],
)
def test_a_wrong_custom_schedule_is_refused_by_name(ranks, options, message):
    with pytest.raises(ScheduleError, match=message):
        ps.custom(ranks, **options)


def test_a_custom_schedule_runs_in_dependency_order():
    schedule = ps.custom([["F0.0", "F0.1", "B0.0", "B0.1"], ["F1.0", "B1.0", "F1.1", "B1.1"]], memory_bound=2)
    order = [str(a) for a in ps.issue_order(schedule)]
    assert order.index("SEND_B(stage 1, micro-batch 0)") < order.index("RECV_B(stage 0, micro-batch 0)") < order.index(
        "B(stage 0, micro-batch 0)"
    )
    assert list(schedule.steps(2, 2)) == [(0, 0), (0, 1), (1, 0), (1, 1)]


# ---------------------------------------------------------------------------
# Gradients through stages: tiny Llama, 2 stages x TP 2
# ---------------------------------------------------------------------------


def torch_reference() -> tuple[np.ndarray, dict[str, np.ndarray]]:
    stored = dict(np.load(DATA / "tiny_llama.torch_grads.npz"))
    return stored.pop("loss_weights"), stored


def weighted_sum(outputs, weights):
    """``sum(logits * w)``: the torch fixture's loss; it sums over the batch, so micro-batches add up to it."""
    return jnp.sum(outputs[0] * weights.astype(outputs[0].dtype))


@pytest.fixture(scope="module")
def ids() -> np.ndarray:
    return np.load(DATA / "tiny_llama.inputs.npz")["input_ids"]


@pytest.fixture(scope="module")
def pipeline() -> PipelineCompiled:
    return onnx2jax.compile(staged(LLAMA, 2, 2), microbatches=2, schedule="1f1b", scan_layers=False)


@pytest.fixture(scope="module")
def single() -> Compiled:
    return onnx2jax.compile(str(LLAMA), scan_layers=False)


def _close(got, want, tolerance, name):
    scale = float(np.abs(want).max())
    np.testing.assert_allclose(np.asarray(got, np.float64), want, rtol=0, atol=tolerance * max(scale, 1e-6), err_msg=name)


def test_every_schedule_gives_the_single_programs_gradients(pipeline, single, ids):
    weights, torch_grads = torch_reference()
    trained = {k: pipeline.params[k] for k in pipeline.trainable}
    assert set(trained) == set(single.trainable) == set(torch_grads)
    expected_loss, expected = single.value_and_grad(weighted_sum)(
        {k: single.params[k] for k in single.trainable}, ids, loss_args=(weights,)
    )
    grad = pipeline.value_and_grad(weighted_sum)
    custom = ps.custom([["F0.0", "F0.1", "I0.1", "I0.0", "W0.0", "W0.1"], ["F1.0", "F1.1", "I1.1", "W1.1", "I1.0", "W1.0"]],
                       memory_bound=2, name="mine")  # backward of micro-batch 1 first
    for name in SCHEDULES + (custom,):
        pipeline.schedule = name
        loss, grads = grad(trained, ids, loss_args=(weights,))
        assert float(loss) == pytest.approx(float(expected_loss), rel=1e-6), name
        for key, want in torch_grads.items():
            assert grads[key].sharding.is_equivalent_to(pipeline.params[key].sharding, grads[key].ndim), (name, key)
            _close(grads[key], np.asarray(expected[key]), 1e-6, (name, key))
            _close(grads[key], want, 1e-5, (name, key))
        held = {"gpipe": [2, 2], custom: [2, 2]}.get(name, [2, 1])  # 1F1B: at most min(M, S - s); GPipe: M
        assert grad.peak_held == held, name
    pipeline.schedule = "1f1b"


def mean_next_token_loss(outputs, ids_):
    """Next-token cross entropy summed, over the whole batch's count: micro-batches add up to the batch mean."""
    count = 2 * 15  # tiny_llama.inputs.npz: batch 2 x 16 tokens
    return optax.softmax_cross_entropy_with_integer_labels(outputs[0][:, :-1], ids_[:, 1:]).sum() / count


# Each has a state per parameter (momentum; Adam's two moments and its step count), kept on its stage. Adam's
# eps is 1e-3, not 1e-8: a first Adam step is lr * g / (|g| + eps), so with a tiny eps a gradient entry near 0
# moves its weight by +-lr on the sign of its rounding (seen: 1 of 16384 entries 3e-4 off); at 1e-3 a gradient
# difference of d moves it by at most lr * d / eps = 10 d.
OPTIMIZERS = {"sgd-momentum": optax.sgd(0.5, momentum=0.9), "adam": optax.adam(1e-2, eps=1e-3)}
STEPS = 2


def _steps(executable, ids, optimizer):
    step = train_step(executable, mean_next_token_loss, optimizer)
    params = {k: executable.params[k] for k in executable.trainable}
    state = step.init(params)
    losses = []
    for _ in range(STEPS):
        params, state, loss = step(params, state, ids, loss_args=(ids,))
        losses.append(float(loss))
    return params, state, losses


@pytest.fixture(scope="module", params=sorted(OPTIMIZERS))
def single_steps(request, single, ids):
    """(optimizer name, the reference): the same steps on the unstaged model as one program."""
    return request.param, _steps(single, ids, OPTIMIZERS[request.param])


def _stage_devices(tree) -> set:
    return {frozenset(d.id for d in leaf.sharding.device_set) for leaf in jax.tree.leaves(tree)}


def test_optimizer_steps_through_1f1b_equal_the_single_program(pipeline, single_steps, ids):
    name, (expected, _, expected_losses) = single_steps
    params, state, losses = _steps(pipeline, ids, OPTIMIZERS[name])
    assert len(state) == 2  # one optimizer state per stage ...
    assert [_stage_devices(group) for group in state] == [{frozenset({0, 1})}, {frozenset({2, 3})}]  # ... on its devices
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    for key in expected:
        assert params[key].sharding.is_equivalent_to(pipeline.params[key].sharding, params[key].ndim), key
        np.testing.assert_allclose(np.asarray(params[key]), np.asarray(expected[key]), atol=2e-5, err_msg=key)


def test_nnx_optimizer_steps_a_pipelined_module(pipeline, single_steps, ids):
    """``onnx2jax.nnx`` over pipeline stages: nnx.Optimizer, its optax transform wrapped in per_device_group,
    updates each Param and keeps each state on its stage's devices."""
    from flax import nnx

    from onnx2jax.nnx import OnnxModule, per_device_group

    name, (expected, _, expected_losses) = single_steps
    module = OnnxModule(pipeline)
    optimizer = nnx.Optimizer(module, per_device_group(OPTIMIZERS[name]), wrt=nnx.Param)
    grad = module.value_and_grad(mean_next_token_loss)
    losses = []
    for _ in range(STEPS):
        loss, grads = grad(ids, loss_args=(ids,))
        optimizer.update(module, grads)
        losses.append(float(loss))
    np.testing.assert_allclose(losses, expected_losses, rtol=1e-5)
    state = nnx.as_pure(optimizer.opt_state)
    assert [_stage_devices(group) for group in state] == [{frozenset({0, 1})}, {frozenset({2, 3})}]
    values = module.values()
    for key in expected:
        assert values[key].sharding.is_equivalent_to(pipeline.params[key].sharding, values[key].ndim), key
        np.testing.assert_allclose(np.asarray(values[key]), np.asarray(expected[key]), atol=2e-5, err_msg=key)
    with pytest.raises(PipelineJitError):
        nnx.jit(lambda m: m(ids))(module)


def test_a_bare_adam_over_stages_is_what_per_device_group_is_for(pipeline, ids):
    """Why the wrapper exists: nnx.Optimizer with a bare optax.adam over two stages fails at its first update
    (one jitted bias correction over both stages' moments). If jax or optax ever accept it, this test says so."""
    from flax import nnx

    from onnx2jax.nnx import OnnxModule

    module = OnnxModule(pipeline)
    optimizer = nnx.Optimizer(module, optax.adam(1e-2), wrt=nnx.Param)
    _, grads = module.value_and_grad(mean_next_token_loss)(ids, loss_args=(ids,))
    with pytest.raises(ValueError, match="incompatible devices"):
        optimizer.update(module, grads)


def test_interleaved_1f1b_over_virtual_stages_gives_torchs_gradients(ids):
    """4 stages on 2 devices (stage s on device s % 2): two virtual stages per rank, Megatron's interleaved order."""
    from sharding.stages import write_stages

    model = onnx.load(LLAMA)
    stage_of, _ = auto_stages(model, 4)
    write_stages(model, stage_of, {0: [0], 1: [1], 2: [0], 3: [1]}, "pp")
    pipeline = onnx2jax.compile(model, microbatches=2, schedule="interleaved-1f1b", scan_layers=False)
    assert pipeline.stage_ranks() == (0, 1, 0, 1)
    assert pipeline.training_schedule().stage_rank == (0, 1, 0, 1)
    weights, torch_grads = torch_reference()
    loss, grads = pipeline.value_and_grad(weighted_sum)(
        {k: pipeline.params[k] for k in pipeline.trainable}, ids, loss_args=(weights,)
    )
    for key, want in torch_grads.items():
        _close(grads[key], want, 1e-5, key)
    pipeline.schedule = "1f1b"
    with pytest.raises(ScheduleError, match="'1f1b' runs one stage per rank, but 4 stages share 2 device groups"):
        pipeline.value_and_grad(weighted_sum)({}, ids, loss_args=(weights,))


def test_a_pipelined_checkpoint_restores_onto_one_device(pipeline, single, tmp_path):
    """Parameters and optimizer state saved from 2 stages x TP 2 (each array on its stage), restored onto one device."""
    from onnx2jax import checkpoint

    rng = np.random.default_rng(2)
    trained = {k: pipeline.params[k] + rng.normal(size=pipeline.params[k].shape).astype(np.float32)
               for k in pipeline.trainable}
    step = train_step(pipeline, weighted_sum, optax.adam(1e-3))
    state = step.init(trained)
    checkpoint.save(tmp_path / "ckpt", {"params": trained, "opt": state})
    like = {k: single.params[k] for k in single.trainable}
    restored = checkpoint.restore(tmp_path / "ckpt", {"params": like, "opt": step.init(trained)})
    for key, value in restored["params"].items():
        np.testing.assert_array_equal(np.asarray(value), np.asarray(trained[key]), err_msg=key)  # numpy of the saved
        assert value.sharding.device_set == like[key].sharding.device_set, key


def test_a_pipeline_has_the_executable_training_face(pipeline, single, ids, tmp_path):
    assert pipeline.trainable == tuple(k for k in pipeline.params if k in set(single.trainable))
    few = pipeline.with_trainable(pipeline.trainable[:2])
    assert few.trainable == pipeline.trainable[:2] and pipeline.trainable != few.trainable
    near = pipeline.trainable[0]
    for executable in (pipeline, single):  # one error for one mistake, as apply's (a KeyError too, as before)
        with pytest.raises(ParameterError, match=rf"with_trainable: 'nope' is not a parameter of this model; its"):
            executable.with_trainable(["nope"])
        with pytest.raises(KeyError, match=rf"with_trainable: '{near}x' is not a parameter .*did you mean '{near}'"):
            executable.with_trainable([f"{near}x"])
        # a gradient asked of no parameter is refused, not zero
        with pytest.raises(ParameterError, match=r"value_and_grad: 'nope' is not a parameter of this model"):
            executable.value_and_grad(weighted_sum)({"nope": np.zeros(3, np.float32)}, ids)
    rng = np.random.default_rng(5)
    new = {k: pipeline.params[k] + 0.05 * rng.normal(size=pipeline.params[k].shape).astype(np.float32)
           for k in pipeline.trainable}
    written = pipeline.to_onnx(new, tmp_path / "trained.onnx")
    assert [n.device_configurations for n in written.graph.node] == [
        n.device_configurations for n in staged(LLAMA, 2, 2).graph.node
    ]
    (reference,) = ort_outputs(written, {"input_ids": ids})
    with jax.enable_x64(True):  # the same values in the single program (the Megatron stages store ONNX shapes)
        (logits,) = jax.jit(single.apply)({**single.params, **{k: np.asarray(v) for k, v in new.items()}}, ids)
    np.testing.assert_allclose(np.asarray(logits), reference, rtol=1e-4, atol=1e-4)
    (before,) = ort_outputs(onnx.load(LLAMA), {"input_ids": ids})
    assert np.abs(reference - before).max() > 1e-2  # the new weights are the ones onnxruntime ran
    with pytest.raises(PipelineJitError, match="cannot run under jax.jit .* compiled.value_and_grad"):
        with jax.enable_x64(True):
            jax.jit(pipeline.apply)(pipeline.params, ids)


def test_lower_runs_nothing(pipeline, ids, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("lower() ran a stage")

    monkeypatch.setattr(PipelineCompiled, "_run", refuse)
    monkeypatch.setattr(Compiled, "__call__", refuse)
    lowered = pipeline.lower(ids)
    assert len(lowered) == 2 and all(isinstance(x, jax.stages.Lowered) for x in lowered)
    assert "all-reduce" in lowered[0].compile().as_text()  # TP 2 inside stage 0


def test_a_forward_only_order_cannot_train(pipeline, ids):
    class Forwards:
        def steps(self, stages, microbatches):
            return iter([(0, 0), (1, 0), (0, 1), (1, 1)])

    other = onnx2jax.compile(staged(LLAMA, 2, 1), microbatches=2)
    other.schedule = Forwards()
    with pytest.raises(ScheduleError, match="orders forwards only"):
        other.value_and_grad(weighted_sum)({}, ids, loss_args=(torch_reference()[0],))
    with pytest.raises(ScheduleError, match="unknown schedule 'zb'"):
        onnx2jax.compile(staged(LLAMA, 2, 1), schedule="zb")
    with pytest.raises(ValueError, match="schedule='1f1b' needs a model with pipeline stages"):
        onnx2jax.compile(str(LLAMA), schedule="1f1b")


# ---------------------------------------------------------------------------
# The zoo's decoders (slow)
# ---------------------------------------------------------------------------

DECODERS = ("gpt2", "gpt_neox", "mistral", "qwen2", "phi3")


@pytest.mark.slow
@pytest.mark.parametrize("name", DECODERS)
@pytest.mark.parametrize(("stages", "tp"), [(2, 1), (2, 2), (4, 1), (4, 2)])
def test_zoo_decoders_train_through_every_schedule(name, stages, tp):
    path = ZOO / f"{name}.onnx"
    ids = dict(np.load(ZOO / f"{name}.inputs.npz"))["input_ids"]
    ids = np.concatenate([ids, ids[:, ::-1]])  # batch 4: 4 micro-batches of 1
    single = onnx2jax.compile(str(path), scan_layers=False)
    weights = np.random.default_rng(3).normal(size=single(ids)[0].shape).astype(np.float32)
    trained = {k: single.params[k] for k in single.trainable}
    _, expected = single.value_and_grad(weighted_sum)(trained, ids, loss_args=(weights,))
    pipeline = onnx2jax.compile(staged(path, stages, tp), microbatches=4, scan_layers=False)
    assert set(pipeline.trainable) == set(trained)
    grad = pipeline.value_and_grad(weighted_sum)
    for schedule in SCHEDULES:
        pipeline.schedule = schedule
        _, grads = grad({k: pipeline.params[k] for k in pipeline.trainable}, ids, loss_args=(weights,))
        for key in expected:
            holder = next(s.compiled for s in pipeline.stages if key in s.compiled.params)
            got = np.asarray(holder._logical_params({key: grads[key]})[key])
            want = np.asarray(single._logical_params({key: expected[key]})[key])
            _close(got, want, 1e-5, (schedule, key))


@pytest.mark.slow  # the example end to end; its mechanism: test_every_schedule_gives_the_single_programs_gradients
def test_finetune_pipeline_example_matches_the_single_program():
    import importlib.util

    path = Path(__file__).resolve().parents[2] / "examples" / "finetune_pipeline.py"
    spec = importlib.util.spec_from_file_location("finetune_pipeline", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.main(["--steps", "2", "--batch", "4", "--microbatches", "2"]) < 1e-4


def test_a_segmented_run_has_the_training_face(tmp_path):
    """Segments (a NonZero between two products): trainable weights, and trained values written back run in onnxruntime."""
    from test_segments_sharded import nonzero_then_matmul

    compiled = onnx2jax.compile(nonzero_then_matmul())
    assert compiled.trainable == ("w0", "w2")  # not the axes nor the folded zero
    assert compiled.with_trainable(["w2"]).trainable == ("w2",) and compiled.trainable == ("w0", "w2")
    with pytest.raises(ParameterError, match=r"with_trainable: 'w00' is not a parameter .*did you mean 'w0'"):
        compiled.with_trainable(["w00"])
    # the Executable protocol's value_and_grad: refused by name (no gradient flows through a host step)
    with pytest.raises(NotDifferentiableError, match=r"value_and_grad: node '[^']+' \(NonZero\) runs on the host"):
        compiled.value_and_grad(lambda outputs: outputs[0].sum())
    new = {"w2": np.asarray(compiled.params["w2"]) * -2.0}
    written = compiled.to_onnx(new, tmp_path / "segmented.onnx")
    x = np.random.default_rng(3).normal(size=(6, 16)).astype(np.float32)
    (reference,) = ort_outputs(written, {"x": x})
    (expected,) = compiled(x)
    np.testing.assert_allclose(reference, -2.0 * np.asarray(expected), rtol=1e-5, atol=1e-5)
