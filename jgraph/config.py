"""Typed experiment configs: frozen dataclasses, loaded from YAML, overridden by
`--set a.b=c`.

Every field has a type and a default; a YAML file or an override may only name fields
that exist (an unknown key fails with the list of valid keys at that level), and each
value is converted to the field's type (enums by value, tuples from lists, numbers
from strings; never NaN or infinity), with an error naming the key when it cannot be.
"""
from __future__ import annotations

import dataclasses
import enum
import math
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

import yaml


class ConfigError(ValueError):
    """A config file or override jgraph cannot use; the message names the key."""


def _convert(value: Any, kind: Any, key: str) -> Any:
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return _convert(value, option, key)
            except ConfigError as err:
                errors.append(str(err))
        raise ConfigError(errors[0] if errors else f"{key}: cannot be {value!r}")
    if dataclasses.is_dataclass(kind):
        if isinstance(value, kind):
            return value
        if not isinstance(value, Mapping):
            raise ConfigError(f"{key}: expected a mapping of {_names(kind)}, got {value!r}")
        return build(kind, value, prefix=f"{key}.")
    if origin is tuple or kind is tuple:
        if isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
            value = [value] if not isinstance(value, str) else [v for v in value.split(",") if v]
        inner = args[0] if args else Any
        return tuple(_convert(v, inner, f"{key}[{i}]") for i, v in enumerate(value))
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        try:
            return kind(value)
        except ValueError:
            raise ConfigError(f"{key}: {value!r} is not one of "
                              f"{[m.value for m in kind]}") from None
    if kind is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"{key}: expected true or false, got {value!r}")
    if kind in (int, float):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise ConfigError(f"{key}: expected a number, got {value!r}")
        try:
            number = kind(value)
        except (ValueError, OverflowError):
            raise ConfigError(f"{key}: expected {kind.__name__}, got {value!r}") from None
        if kind is int and isinstance(value, float) and value != number:
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        if not math.isfinite(number):
            raise ConfigError(f"{key}: expected a finite number, got {value!r}")
        return number
    if kind is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return value
    return value


def _names(cls) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def build(cls, values: Mapping[str, Any], prefix: str = ""):
    """An instance of dataclass `cls` from a (nested) mapping; unknown keys fail."""
    hints = typing.get_type_hints(cls)
    unknown = sorted(set(values) - set(hints))
    if unknown:
        raise ConfigError(f"unknown config key {prefix}{unknown[0]}; valid keys"
                          f"{' under ' + prefix.rstrip('.') if prefix else ''}: {_names(cls)}")
    fields = {name: _convert(value, hints[name], prefix + name)
              for name, value in values.items()}
    try:
        return cls(**fields)
    except ConfigError:                      # the dataclass's own checks, naming the key
        raise
    except (ValueError, TypeError) as err:
        raise ConfigError(f"{prefix.rstrip('.') or cls.__name__}: {err}") from None


def to_dict(config) -> dict:
    """Plain data (enums as values, tuples as lists), for YAML and JSON."""
    def plain(x):
        if dataclasses.is_dataclass(x):
            return {f.name: plain(getattr(x, f.name)) for f in dataclasses.fields(x)}
        if isinstance(x, enum.Enum):
            return x.value
        if isinstance(x, (tuple, list)):
            return [plain(v) for v in x]
        return x
    return plain(config)


def override(config, assignments: Sequence[str]):
    """Apply `a.b=c` assignments (c parsed as YAML) to a config; returns a new one."""
    values = {}
    for item in assignments:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ConfigError(f"--set {item!r}: expected key=value, e.g. model.hidden=256")
        values[key] = yaml.safe_load(text) if text else ""
    return with_values(config, values)


def with_values(config, values: Mapping[str, Any]):
    """`config` with each dotted key of `values` set (converted to the field's type and
    checked as when loading a file); returns a new one."""
    tree = to_dict(config)
    for key, value in values.items():
        path = key.split(".")
        node, cls = tree, type(config)
        for depth, part in enumerate(path):
            hints = typing.get_type_hints(cls)
            where = ".".join(path[:depth])
            if part not in hints:
                raise ConfigError(f"unknown config key {key}; valid keys"
                                  f"{' under ' + where if where else ''}: {_names(cls)}")
            if depth == len(path) - 1:
                node[part] = value
            else:
                kind = hints[part]
                if not dataclasses.is_dataclass(kind):
                    raise ConfigError(f"{'.'.join(path[:depth + 1])} is a value, not a section")
                node, cls = node[part], kind
    return build(type(config), tree)


def load(cls, path: str | None = None, assignments: Sequence[str] = ()):
    """`cls` from a YAML file (or its defaults), then `assignments` applied."""
    values = {}
    if path is not None:
        try:
            with open(path) as f:
                values = yaml.safe_load(f) or {}
        except OSError as err:
            raise ConfigError(f"{path}: cannot read the config ({err.strerror})") from None
        except yaml.YAMLError as err:
            raise ConfigError(f"{path}: not valid YAML: {err}") from None
        if not isinstance(values, Mapping):
            raise ConfigError(f"{path}: the top level must be a mapping of {_names(cls)}")
    try:
        config = build(cls, values)
    except ConfigError as err:
        raise ConfigError(f"{path}: {err}" if path else str(err)) from None
    if path is not None and hasattr(config, "relative_to"):
        # Paths in a file are relative to the file; those of `assignments` (typed in a
        # shell or a program) stay relative to the working directory.
        config = config.relative_to(os.path.dirname(os.path.abspath(path)))
    return override(config, assignments)
