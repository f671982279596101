"""``load_config``: YAML or dict + verl-style dotted overrides → ``TandemConfig`` (configs layer).

Unknown keys fail with their dotted path and the closest valid key; verl keys tandem-rl knows but
does not implement are dropped with one ``ConfigWarning`` each; ``${a.b}`` references (as in verl's
Hydra configs) are resolved against the same document.
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
import warnings
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from pydantic import ValidationError

from configs.base import ConfigWarning, Section
from configs.schema import TandemConfig

_REF = re.compile(r"\$\{([A-Za-z0-9_.]+)\}")


class ConfigError(ValueError):
    """A config that cannot be loaded; the message names the dotted key."""


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, overrides: Iterable[str] = ()
) -> TandemConfig:
    """Load a config from a YAML path or a dict, apply ``key=value`` overrides, validate it."""
    raw = _read_source(source)
    for item in overrides:
        _apply_override(raw, item)
    raw = _resolve_refs(raw, raw)
    _check_keys(raw, TandemConfig, "")
    try:
        return TandemConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def _read_source(source: str | Path | Mapping[str, Any] | None) -> dict[str, Any]:
    if source is None:
        return {}
    if isinstance(source, Mapping):
        return copy.deepcopy(dict(source))
    path = Path(source)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(loaded).__name__}")
    return loaded


def _apply_override(raw: dict[str, Any], item: str) -> None:
    """Apply ``a.b.c=value``; the value parses like a YAML scalar (``4``, ``true``, ``[a,b]``, ``null``)."""
    key, sep, text = item.partition("=")
    key = key.strip().lstrip("+")
    if not sep or not key:
        raise ConfigError(f"override {item!r} must look like dotted.key=value")
    try:
        value = yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        value = text
    node = raw
    parts = key.split(".")
    for depth, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[: depth + 1])} is not a section")
        node = child
    node[parts[-1]] = value


def _resolve_refs(value: Any, root: dict[str, Any], depth: int = 0) -> Any:
    if depth > 16:
        raise ConfigError("config references nest too deep (a ${...} cycle?)")
    if isinstance(value, dict):
        return {k: _resolve_refs(v, root, depth) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve_refs(v, root, depth) for v in value]
    if isinstance(value, str):
        whole = _REF.fullmatch(value)
        if whole:
            return _resolve_refs(_lookup(root, whole.group(1)), root, depth + 1)
        return _REF.sub(lambda m: str(_resolve_refs(_lookup(root, m.group(1)), root, depth + 1)), value)
    return value


def _lookup(root: dict[str, Any], dotted: str) -> Any:
    node: Any = root
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ConfigError(f"reference ${{{dotted}}} points to a key that is not set")
        node = node[part]
    return node


def _section_type(annotation: Any) -> type[Section] | None:
    """The Section class a field holds, if it holds one (also through ``X | None``)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def _check_keys(raw: dict[str, Any], cls: type[Section], prefix: str) -> None:
    fields = cls.model_fields
    for key in list(raw):
        path = f"{prefix}{key}"
        if key in fields:
            sub = _section_type(fields[key].annotation)
            if sub is not None and isinstance(raw[key], dict):
                _check_keys(raw[key], sub, f"{path}.")
        elif key in cls.VERL_UNIMPLEMENTED or cls.VERL_OTHER_KEYS_UNIMPLEMENTED:
            warnings.warn(f"{path}: verl key accepted but not implemented by tandem-rl; ignored",
                          ConfigWarning, stacklevel=3)
            del raw[key]
        else:
            known = list(fields) + sorted(cls.VERL_UNIMPLEMENTED)
            close = difflib.get_close_matches(str(key), known, n=1, cutoff=0.6)
            hint = f"; did you mean {prefix}{close[0]}?" if close else f"; valid keys: {', '.join(fields)}"
            raise ConfigError(f"unknown config key {path}{hint}")


def _format_validation_error(exc: ValidationError) -> str:
    lines = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err["loc"]) or "<root>"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"{loc}: {msg}")
    return "invalid config:\n  " + "\n  ".join(lines)
