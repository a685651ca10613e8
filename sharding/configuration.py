"""Which device configuration a model runs under: one rule for inference, checking and compiling.

A model may define several ``DeviceConfigurationProto``s. The rule:

- a configuration asked for by name must be defined (an ``unknown-configuration`` error);
- none asked for: the model's only one; with several, the first, and a
  ``configuration-chosen`` note says so (inference and ``check`` go on with it;
  ``onnx2jax.compile`` refuses the guess and asks for ``configuration=``);
- a model that defines none: the first ``configuration_id`` its nodes name
  (``sharding.validate`` reports that id as undefined), else None (unannotated).
"""

from __future__ import annotations

import dataclasses

import onnx

from sharding import codes
from sharding.diagnostics import Diagnostic


@dataclasses.dataclass(frozen=True)
class ConfigurationChoice:
    """The configuration chosen and what the choice found.

    Attributes:
        name: the configuration (None: the model is unannotated).
        defined: the names the model defines, in order.
        diagnostics: an ``unknown-configuration`` error or a ``configuration-chosen`` note, if any.
    """

    name: str | None
    defined: tuple[str, ...]
    diagnostics: tuple[Diagnostic, ...] = ()

    @property
    def guessed(self) -> bool:
        """Whether the model has several configurations and none was asked for."""
        return any(d.code == codes.CONFIGURATION_CHOSEN for d in self.diagnostics)

    @property
    def unknown(self) -> bool:
        """Whether the configuration asked for is not defined."""
        return any(d.severity == "error" for d in self.diagnostics)


def choose_configuration(model: onnx.ModelProto, configuration: str | None = None) -> ConfigurationChoice:
    """The configuration to use for ``model`` (see the module docstring for the rule)."""
    names = tuple(c.name for c in model.configuration)
    if configuration is not None:
        if configuration in names:
            return ConfigurationChoice(configuration, names)
        unknown = Diagnostic(
            code=codes.UNKNOWN_CONFIGURATION,
            severity="error",
            message=f"configuration {configuration!r} is not defined in the model",
            hint=f"choose one of {list(names)}",
        )
        return ConfigurationChoice(configuration, names, (unknown,))
    if not names:
        used = next((c.configuration_id for n in model.graph.node for c in n.device_configurations), None)
        return ConfigurationChoice(used, names)
    if len(names) == 1:
        return ConfigurationChoice(names[0], names)
    chosen = Diagnostic(
        code=codes.CONFIGURATION_CHOSEN,
        severity="note",
        message=f"the model defines configurations {list(names)}; {names[0]!r} was used",
        hint="pass configuration= (or --configuration) to choose",
    )
    return ConfigurationChoice(names[0], names, (chosen,))


__all__ = ["ConfigurationChoice", "choose_configuration"]
