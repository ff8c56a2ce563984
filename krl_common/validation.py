"""The field checks every JSON boundary of the project shares (eval requests, trajectory
records, buffer requests): one error type whose message names the field, one type check that
never lets a JSON `true` pass for a number, one unknown-field rule."""

from __future__ import annotations

import math
from typing import Any


class ValidationError(ValueError):
    """Input that does not match a schema; the message names the field (and index)."""


def type_name(expected: type | tuple[type, ...]) -> str:
    if isinstance(expected, tuple):
        return " or ".join(t.__name__ for t in expected)
    return expected.__name__


def check_type(path: str, value: Any, expected: type | tuple[type, ...]) -> None:
    # bool is an int subclass in Python; never accept it where a number is expected.
    if isinstance(value, bool) and bool not in (expected if isinstance(expected, tuple) else (expected,)):
        raise ValidationError(f"{path}: expected {type_name(expected)}, got bool")
    if not isinstance(value, expected):
        raise ValidationError(f"{path}: expected {type_name(expected)}, got {type(value).__name__}")


def reject_unknown(path: str, data: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(data) - allowed)
    if unknown:
        where = f"{path}: " if path else ""
        raise ValidationError(f"{where}unknown field(s) {unknown}; allowed: {sorted(allowed)}")


def check_int_range(path: str, value: Any, lo: int, hi: int) -> int:
    """An integer (never a bool) in [lo, hi]; the message gives the range a caller may send."""
    check_type(path, value, int)
    if not lo <= value <= hi:
        raise ValidationError(f"{path}: must be an integer in [{lo}, {hi}]")
    return int(value)


def check_number_range(path: str, value: Any, lo: float, hi: float) -> float:
    """A finite number (int or float, never a bool) in [lo, hi], as a float; an int too large
    for a float is out of range rather than an OverflowError."""
    check_type(path, value, (int, float))
    try:
        number = float(value)
    except OverflowError:
        number = math.inf
    if not (math.isfinite(number) and lo <= number <= hi):
        raise ValidationError(f"{path}: must be a number in [{lo:g}, {hi:g}]")
    return number
