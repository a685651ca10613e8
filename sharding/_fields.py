"""Normalising the constructor arguments of the typed sharding values, naming the field on failure.

Shared by `sharding.spec` (the specs) and `sharding.model_configs` (a model's
configurations and node annotations).
"""

from __future__ import annotations

import operator
from collections.abc import Iterable
from typing import Any


def _as_int(value: Any, field: str, minimum: int | None = None) -> int:
    if isinstance(value, bool):
        raise TypeError(f"{field} must be an int, got bool")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{field} must be an int, got {type(value).__name__}") from None
    if minimum is not None and number < minimum:
        raise ValueError(f"{field} must be >= {minimum}, got {number}")
    return number


def _as_tuple(value: Any, field: str) -> tuple:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise TypeError(f"{field} must be a sequence, got {type(value).__name__}")
    return tuple(value)


def _as_str(value: Any, field: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{field} must be a str, got {type(value).__name__}")
    return value


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)


def _require(proto: Any, field: str) -> None:
    if not proto.HasField(field):
        raise ValueError(f"{type(proto).__name__}.{field} is missing (the IR requires it)")
