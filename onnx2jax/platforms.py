"""Which platform JAX starts on, where the user left it to JAX: the CPU when the machine shows no accelerator.

With libtpu installed (the ``tpu`` and ``test`` extras, to compile for TPU topologies ahead of time), every
JAX start on a machine without a TPU also tries to open one, and libtpu prints its warnings. The CLI's fake
devices (``--devices``) and compiles for a target (``--target``) need no TPU backend: both choose the CPU
through :func:`prefer_cpu_without_accelerator`, which changes nothing when ``JAX_PLATFORMS`` is set, an
accelerator is visible, or JAX has started. Importing this module imports no jax.
"""

from __future__ import annotations


def accelerator_visible() -> bool:
    """Whether this machine shows a TPU chip or an NVIDIA or AMD GPU: JAX's own probes (they read ``/sys`` and
    ``/dev`` and start nothing). Were they ever gone from jax, the answer is True: JAX then picks its platform
    itself, as it would without onnx2jax."""
    try:
        from jax._src import hardware_utils as hw
    except ImportError:
        return True
    probes = ("num_available_tpu_chips_and_device_id", "has_visible_nvidia_gpu", "num_available_amd_gpus")
    if not all(hasattr(hw, name) for name in probes):
        return True
    return (hw.num_available_tpu_chips_and_device_id()[0] > 0 or hw.has_visible_nvidia_gpu()
            or hw.num_available_amd_gpus(stop_at=1) > 0)


def prefer_cpu_without_accelerator() -> bool:
    """Sets JAX's platform to ``cpu`` where it is left to JAX and no accelerator is visible; True when it did."""
    import jax

    if jax.config.jax_platforms or accelerator_visible():
        return False
    try:
        jax.config.update("jax_platforms", "cpu")
    except RuntimeError:  # JAX has started: its platform is chosen
        return False
    return True
