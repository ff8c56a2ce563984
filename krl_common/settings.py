"""Typed settings dataclasses read from mappings (a recipe section, a flag's overrides).

A settings object is one frozen dataclass: its annotations are the types, its defaults the
defaults, its `__post_init__` the value rules (>= 1, > 0, one of ...). `parse_settings` reads a
mapping into it and checks every given value against the field's annotation, so no module
restates a field's type in a dict of its own, and every error names the dotted key path the user
wrote (`kernel_rl.runner.temperature: expected int or float, got str`).

It lives apart from `validation.py`, whose per-field checks the JSON wire formats call one
field at a time; this is the generic reader of settings dataclasses (read once per process),
built on that module's error type and unknown-field rule.

Annotations understood: bool (never an int), int (never a bool), float (an int is accepted and
kept as is), str, None, `X | None` / `Optional[X]` and other unions, `tuple[X, ...]`,
`tuple[X, Y]`, `list[X]` (from a YAML list or a tuple), `dict[K, V]` / `Mapping[K, V]`,
`Literal[...]`, `Any`, and nested settings dataclasses (from a mapping, or given already built).
"""

from __future__ import annotations

import dataclasses
import functools
import types
import typing
from collections.abc import Mapping
from typing import Any, TypeVar

from krl_common.validation import ValidationError, reject_unknown

__all__ = ["parse_settings"]

T = TypeVar("T")

_SCALARS: dict[type, tuple[type, ...]] = {bool: (bool,), int: (int,), float: (int, float), str: (str,)}
_SEQUENCES = (list, tuple)


def parse_settings(cls: type[T], data: Any, path: str, *, base: T | None = None) -> T:
    """`cls` (a dataclass) built from the mapping `data`, read from the YAML key `path`.

    Unknown keys, a missing (or null) field that has no default, and a value that does not
    match its field's annotation are ValidationErrors naming the key. Lists become tuples where
    the annotation is a tuple, mappings become nested dataclasses where it is one (an empty
    section, None, means the nested defaults). The constructor's own errors (`__post_init__`'s
    value rules) come back as ValidationError `"{path}: {message}"`. With `base` (an instance
    of cls), the given keys replace its values instead of the defaults."""
    if not isinstance(data, Mapping):
        raise ValidationError(f"{path}: expected dict, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    reject_unknown(path, dict(data), set(fields))
    if base is None:
        missing = [
            name
            for name, f in fields.items()
            if f.default is dataclasses.MISSING
            and f.default_factory is dataclasses.MISSING
            and data.get(name) is None
        ]
        if missing:
            raise ValidationError(f"{path}: missing required setting(s) {missing}")
    hints = _hints(cls)
    kwargs = {key: _read(value, hints[key], _join(path, key)) for key, value in data.items()}
    try:
        return dataclasses.replace(base, **kwargs) if base is not None else cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{path}: {exc}") from None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    """The resolved annotations of a settings class (modules use `from __future__ import annotations`)."""
    return typing.get_type_hints(cls)


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _read(value: Any, hint: Any, path: str) -> Any:
    """`value` checked against `hint` (and converted: list -> tuple, mapping -> dataclass)."""
    if hint is Any:
        return value
    if hint is None or hint is type(None):
        if value is not None:
            raise ValidationError(f"{path}: expected None, got {type(value).__name__}")
        return None
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        return _read_union(value, args, path)
    if origin is typing.Literal:
        if not any(value == a and type(value) is type(a) for a in args):
            raise ValidationError(f"{path}: expected one of {list(args)}, got {value!r}")
        return value
    if dataclasses.is_dataclass(hint) and isinstance(hint, type):
        if isinstance(value, hint):
            return value
        return parse_settings(hint, {} if value is None else value, path)
    if hint in _SCALARS:
        _expect(value, _SCALARS[hint], path)
        return value
    if hint in (tuple, list) or origin in (tuple, list):
        _expect(value, _SEQUENCES, path)
        hints = _item_hints(origin, args, len(value), path)
        items = [_read(v, h, f"{path}[{i}]") for i, (v, h) in enumerate(zip(value, hints, strict=True))]
        return items if list in (hint, origin) else tuple(items)
    if hint in (dict, Mapping) or origin in (dict, Mapping):
        _expect(value, (Mapping,), path, name="dict")
        key_hint, value_hint = args if args else (Any, Any)
        return {
            _read(k, key_hint, f"{path} (key {k!r})"): _read(v, value_hint, _join(path, str(k)))
            for k, v in value.items()
        }
    raise TypeError(f"{path}: settings annotation {hint!r} is not supported by parse_settings")


def _read_union(value: Any, arms: tuple[Any, ...], path: str) -> Any:
    """The first arm `value` matches; None only where the union has None. With one arm besides
    None (`X | None`), that arm's own error is raised, so nested paths stay precise."""
    if value is None and type(None) in arms:
        return None
    others = [a for a in arms if a is not type(None)]
    errors: list[ValidationError] = []
    for arm in others:
        try:
            return _read(value, arm, path)
        except ValidationError as exc:
            errors.append(exc)
    if len(others) == 1:
        raise errors[0]
    names = " or ".join(_describe(a) for a in arms)
    raise ValidationError(f"{path}: expected {names}, got {type(value).__name__}")


def _item_hints(origin: Any, args: tuple[Any, ...], length: int, path: str) -> list[Any]:
    """The annotation of each item: `tuple[X, ...]` and `list[X]` repeat X, `tuple[X, Y]` fixes the length."""
    if not args:
        return [Any] * length
    if origin is list or (len(args) == 2 and args[1] is Ellipsis):
        return [args[0]] * length
    if length != len(args):
        raise ValidationError(f"{path}: expected {len(args)} items, got {length}")
    return list(args)


def _expect(value: Any, expected: tuple[type, ...], path: str, name: str | None = None) -> None:
    # bool is an int subclass in Python; never accept it where a number is expected.
    if (isinstance(value, bool) and bool not in expected) or not isinstance(value, expected):
        what = name or " or ".join(t.__name__ for t in expected)
        raise ValidationError(f"{path}: expected {what}, got {type(value).__name__}")


def _describe(hint: Any) -> str:
    if hint is type(None):
        return "None"
    if hint in _SCALARS:
        return " or ".join(t.__name__ for t in _SCALARS[hint])
    origin = typing.get_origin(hint) or hint
    if origin in (tuple, list):
        return "list or tuple"
    if origin in (dict, Mapping) or dataclasses.is_dataclass(origin):
        return "dict"
    return getattr(origin, "__name__", repr(hint))
