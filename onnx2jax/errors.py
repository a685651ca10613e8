"""Every public exception of onnx2jax, in one module (jax-free).

onnx2jax's own: `ModelLoadError` (defined in `sharding.model_arg`, which raises it too), `UnsupportedOpError`, `NodeError`, `PrecisionError`, `DeviceCountError`, `InputError`, `InputRangeError`,
`ParameterError`, `ConfigurationError`, `CacheFolderError`, `ScheduleError`, `PipelineJitError`, `NotDifferentiableError`
(and `BranchShapesDiffer`, the signal that cuts an If out as a host step). The jax-free ``sharding``
package defines the errors of the formalism, re-exported here so that one import serves every caller:
`ShardingError` (invalid annotations), `SpecSyntaxError` (the text notation), `MeshMappingError` (specs
that no one device mesh expresses), `BackwardEdgeError` (a partition with an edge from a later part back),
and the requests an automatic plan refuses (`sharding.auto.errors`, all `AutoPlanError`): `MemoryLimitError`
(no layout fits the memory per device; names the smallest that does), `DeviceSplitError` (the device count
cannot split the model), `MeshShapeError` (a mesh shape that does not exist).

`ChipMemoryError`, a `MemoryLimitError`, is a program compiled for a TPU chip that does not fit its memory.
"""

from __future__ import annotations

from sharding.auto.errors import AutoPlanError as AutoPlanError
from sharding.auto.errors import DeviceSplitError as DeviceSplitError
from sharding.auto.errors import MemoryLimitError as MemoryLimitError
from sharding.auto.errors import MeshShapeError as MeshShapeError
from sharding.diagnostics import ShardingError as ShardingError
from sharding.model_arg import ModelLoadError as ModelLoadError
from sharding.mesh.layout import MeshMappingError as MeshMappingError
from sharding.partition import BackwardEdgeError as BackwardEdgeError
from sharding.text import SpecSyntaxError as SpecSyntaxError


class ChipMemoryError(MemoryLimitError):
    """A program compiled for a TPU chip needs more memory per chip than the chip has: the TPU compiler
    refused it (XLA's RESOURCE_EXHAUSTED, translated by :func:`onnx2jax.runtime.tpu_report.compile_for_tpu`),
    or its report's peak exceeds the chip's HBM. A :class:`MemoryLimitError`, as an automatic plan's is.

    Attributes:
      chip: the chip's version (``"v5e"``).
      needed: bytes per chip the program needs (None where the compiler did not say).
      available: bytes per chip it may use (the compiler's figure where it gave one, else the chip's HBM).
      what: what needs them (``"the program's HLO temporaries"``).
    """

    def __init__(self, chip: str, needed: int | None, available: int, what: str = "the program"):
        self.chip, self.needed, self.available, self.what = chip, needed, available, what
        gib = 1 << 30
        if needed is None:
            head = f"{what} does not fit a TPU {chip} chip's memory ({available / gib:.2f} GiB per chip)"
        else:
            head = (f"{what}: {needed:,} bytes ({needed / gib:.2f} GiB) per chip, over the "
                    f"{available:,} bytes ({available / gib:.2f} GiB) a TPU {chip} chip offers, by "
                    f"{(needed - available) / gib:.2f} GiB")
        super().__init__(f"{head}: shard it over more chips, or make the batch or sequence smaller")


class UnsupportedOpError(NotImplementedError):
    """The model uses ops that onnx2jax does not implement.

    Attributes:
      missing: every unsupported ``(domain, op_type, opset)`` of the model,
        sorted, each once.
    """

    def __init__(self, missing: list[tuple[str, str, int]]):
        self.missing = sorted(set(missing))
        listed = ", ".join(
            f"{d or 'ai.onnx'}::{op}@{v}" for d, op, v in self.missing
        )
        super().__init__(f"{len(self.missing)} unsupported op(s): {listed}")


class NodeError(RuntimeError):
    """An op failed while tracing; names the node, its op_type and opset.

    Attributes:
      node: the failing node, when the graph runner raised it (else None).
    """

    node = None


class InputError(TypeError, ValueError):
    """A call's arguments do not fit the model's inputs: missing, unknown, given twice, or of the wrong
    dtype, rank or size; the message names the input and what the model declares.

    A ``TypeError`` (as a Python function's wrong arguments are) and a ``ValueError`` (a user's mistake, not
    a bug of onnx2jax: the command line prints it as one line).
    """


class ParameterError(InputError, KeyError):
    """Parameters given to an executable (``apply``, ``to_onnx``, ``with_trainable``, ``value_and_grad``'s
    function) that it does not have, or of another shape or dtype than it holds them; the message names the
    parameter, what was given and what is expected.

    Also a ``KeyError`` (what ``with_trainable`` and ``value_and_grad`` raised for an unknown name before),
    printed as its message, not quoted as a ``KeyError``'s key is.
    """

    __str__ = BaseException.__str__


class ConfigurationError(ValueError):
    """The device configuration to compile is not settled: the model defines several and none was chosen,
    or the one chosen is not defined. The message names the configurations the model defines.

    Attributes:
      defined: the configurations' names, in the model's order.
      asked: the name asked for (None when none was).
    """

    def __init__(self, defined: tuple[str, ...], asked: str | None = None):
        self.defined, self.asked = tuple(defined), asked
        if asked is None:
            message = (f"the model defines {len(self.defined)} device configurations {list(self.defined)}; "
                       "choose one: onnx2jax.compile(..., configuration=NAME) "
                       "(onnx2jax run --configuration NAME)")
        else:
            message = f"configuration {asked!r} is not defined in the model; it defines {list(self.defined)}"
        super().__init__(message)


class InputRangeError(ValueError):
    """An integer input indexes a table beyond its size (a token id past the vocabulary, say).

    XLA does not refuse it: it clamps the index or fills NaN, and answers anyway;
    :mod:`onnx2jax.input_checks` refuses it on the host before the call.

    Attributes:
      input: the graph input's name.
      position: the offending element's index in that input.
      value: its value.
      bound: the size of the indexed axis; values in ``[-bound, bound)`` are valid.
      node, op, table: the indexing node, its op_type and the tensor it indexes.
      component: for GatherND/ScatterND, which coordinate of the index vector (else None).
    """

    def __init__(self, input: str, position: tuple[int, ...], value: int, bound: int, node: str, op: str,
                 table: str, component: int | None = None):
        self.input, self.position, self.value, self.bound = input, position, value, bound
        self.node, self.op, self.table, self.component = node, op, table, component
        what = f"{table!r} (coordinate {component} of each index)" if component is not None else f"{table!r}"
        super().__init__(
            f"input {input!r} at {list(position)} is {value}, outside [{-bound}, {bound}): node {node!r} ({op}) "
            f"indexes {what}, which has {bound} entries there (onnxruntime refuses it; XLA would answer "
            "with clamped or NaN rows). Only for inputs known to be in range: check_indices=False turns the check off "
            "(onnx2jax run --no-check-indices)"
        )


class TokenIdError(InputRangeError):
    """A prompt's token id outside the vocabulary ``[0, bound)``: generation's :class:`InputRangeError`.

    Generation checks its prompts on the host (:mod:`onnx2jax.runtime.generate_inputs`); a negative id, which
    ONNX's Gather would read from the end, is no token. ``node``, ``op`` and ``table`` are None.
    """

    def __init__(self, input: str, position: tuple[int, int], value: int, bound: int | None):
        self.input, self.position, self.value, self.bound = input, position, value, bound
        self.node = self.op = self.table = None
        self.component = None
        vocab = f"[0, {bound})" if bound is not None else "[0, ...)"
        ValueError.__init__(
            self,
            f"token id {value} at prompt {position[0]}, position {position[1]} ({input!r}) is outside the "
            f"vocabulary {vocab}: the model would gather a row that does not exist (onnxruntime refuses it; XLA "
            "would answer with a clamped or NaN row)",
        )


class BranchShapesDiffer(ValueError):
    """An If's condition is known only at run time and its branches return different shapes.

    One XLA program cannot hold it (``lax.cond`` needs one shape); a main-graph
    If that raises it is cut out as a host step (:mod:`sharding.segments`).
    """


class PrecisionError(RuntimeError):
    """A model with 64-bit tensors is traced while JAX's x64 mode is off."""


class CacheFolderError(OSError):
    """The folder of the persistent compilation cache cannot be created
    (:func:`onnx2jax.runtime.compilation_cache.enable`): a file stands in its path, or no permission.

    An ``OSError``, as the failure to create it is. The command line reports it as a usage error of
    ``--cache``.

    Attributes:
      path: the folder asked for (absolute).
      reason: why it cannot be created (the operating system's words).
    """

    def __init__(self, path: str, reason: str):
        self.path, self.reason = path, reason
        super().__init__(f"compilation cache folder {path}: cannot create the folder ({reason})")


class ScheduleError(ValueError):
    """A pipeline schedule that cannot run: an action before what it needs, a missing or repeated action,
    a stage on the wrong rank, or more micro-batches held than its memory bound. Names the schedule and action.
    """


class NotDifferentiableError(NotImplementedError):
    """``value_and_grad`` asked of an executable whose run carries no gradient: a segmented run
    (:class:`onnx2jax.runtime.segmented.SegmentedCompiled`), whose data-dependent nodes run on the host in
    numpy between its jitted segments. The message names the first host step's node and why it is one.
    """


class PipelineJitError(TypeError):
    """A pipeline's ``apply`` was traced by ``jax.jit``: its stages hold parameters on disjoint device sets."""


class DeviceCountError(ValueError):
    """A model's device configuration needs more devices than JAX offers, or than the mesh has.

    The message names the count needed and how to get it (fake CPU devices
    through ``XLA_FLAGS``). A ``ValueError``, as before it had a class of its own.

    Attributes:
      configuration: the device configuration's name.
      needed: its number of devices.
      available: the devices JAX (or the mesh) has.

    ``hint=False`` leaves out how to get more devices (a mesh of the wrong
    size, when JAX has enough).
    """

    def __init__(self, configuration: str | None, needed: int, available: int, *, mesh: bool = False,
                 hint: bool = True):
        self.configuration = configuration
        self.needed = needed
        self.available = available
        name = f"configuration {configuration!r}" if configuration is not None else "the model"
        if mesh:
            head = (
                f"the mesh has {available} devices but {name} has {needed}: "
                f"build the mesh over {needed} devices (e.g. jax.make_mesh(({needed},), ('x',)))"
            )
        else:
            head = f"{name} needs {needed} devices, JAX has {available}"
        super().__init__(f"{head}; {how_to_get_devices(needed)}" if hint else head)


def how_to_get_devices(count: int) -> str:
    """How to make ``count`` devices visible to JAX, in one clause."""
    return (
        f"on CPU, start Python with XLA_FLAGS=--xla_force_host_platform_device_count={count} "
        f"(or call jax.config.update('jax_num_cpu_devices', {count}) before JAX starts); "
        f"on GPU or TPU, run where {count} devices are visible"
    )


class RequestError(ValueError):
    """A generation request the serving engine refuses: a parameter out of range, a prompt longer than the
    context, a token id outside the vocabulary, a parameter that is not implemented.

    Attributes:
      field: the parameter or input at fault (``"prompt"``, ``"temperature"``, ...).
      reason: what is wrong with it.
    """

    def __init__(self, field: str, reason: str):
        self.field, self.reason = field, reason
        super().__init__(f"{field}: {reason}")


class SearchOptionError(ValueError):
    """A search option of genai_config.json (or given for generation) that onnx2jax does not implement at that
    value (``num_beams`` > 1, say), or does not know: refused by name rather than ignored.

    Attributes:
      option: the option's name.
      value: its value.
      source: where it was read (the genai_config.json's path), or "" where it was given directly.
    """

    def __init__(self, option: str, value: object, source: str, reason: str):
        self.option, self.value, self.source = option, value, source
        where = f" in {source}" if source else ""
        super().__init__(f"search option {option}={value!r}{where}: {reason}")


class TargetError(ValueError):
    """A compile target onnx2jax cannot use: a name it cannot read, a topology libtpu does not know, libtpu
    missing (the message says what to install), or a plan whose mesh does not fit the target.

    Attributes:
      target: the target as given (``"tpu:v5e:2x4"``).
      reason: what is wrong.
    """

    def __init__(self, target: str, reason: str):
        self.target, self.reason = target, reason
        super().__init__(f"target {target!r}: {reason}")


class NoDevicesError(RuntimeError):
    """An executable compiled for a target whose devices are not attached (compile-only TPU devices of a
    topology) was asked to run or to place its parameters: it can only lower, compile and report.

    Attributes:
      target: the target's name.
      action: what was asked (``"run"``, ``"place parameters"``).
    """

    def __init__(self, target: str, action: str):
        self.target, self.action = target, action
        super().__init__(
            f"cannot {action}: this executable is compiled for {target}, whose devices are not attached "
            "(compile-only); lower(), lower().compile() and report() work, running needs that hardware"
        )
