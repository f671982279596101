"""``load_config``: YAML or dict + Hydra-style overrides → ``TandemConfig`` (configs layer).

verl's configs are Hydra/OmegaConf documents, so they are read with OmegaConf: ``${a.b}``, relative
``${.key}``, ``${oc.select:key,default}`` and ``${oc.env:VAR}`` resolve; a ``defaults:`` list is composed from the
files it names next to the config (``group@package: name`` → ``<dir>/group/name.yaml`` at ``package``, or at the
file's ``# @package`` directive; ``${group}`` in a name is that group's choice), entries
whose file does not exist are skipped with a warning; Hydra's ``_target_`` keys are dropped. Overrides follow
Hydra: ``key=value`` sets (a missing key is created), ``+key=value`` adds a key that must not exist,
``++key=value`` sets or adds, ``~key`` deletes. Then the pydantic schema validates the resolved tree: unknown keys
fail with their dotted path and the closest valid key; verl keys tandem-rl knows but does not implement are
dropped with one ``ConfigWarning`` per section that has any (not one line per key).
"""

from __future__ import annotations

import copy
import difflib
import re
import typing
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, Iterable, Mapping

import yaml
from omegaconf import DictConfig, ListConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from pydantic import ValidationError

from configs.base import ConfigWarning, Section
from configs.schema import TandemConfig

HYDRA_KEYS = ("_target_", "_recursive_", "_convert_", "_partial_")


class ConfigError(ValueError):
    """A config that cannot be loaded; the message names the dotted key."""


def load_config(
    source: str | Path | Mapping[str, Any] | None = None, overrides: Iterable[str] = ()
) -> TandemConfig:
    """Load a config from a YAML path or a dict, apply Hydra-style overrides, resolve, validate."""
    tree = _read_source(source)
    for item in overrides:
        _apply_override(tree, item)
    try:
        raw = OmegaConf.to_container(tree, resolve=True)
    except OmegaConfBaseException as exc:
        raise ConfigError(f"config reference: {_omegaconf_message(exc)}") from None
    raw = _drop_hydra_keys(raw)
    unimplemented: dict[str, list[str]] = defaultdict(list)
    _check_keys(raw, TandemConfig, "", unimplemented)
    for section, keys in unimplemented.items():
        shown = ", ".join(keys[:12]) + (f" and {len(keys) - 12} more" if len(keys) > 12 else "")
        where = f"{section}: " if section else ""
        warnings.warn(f"{where}verl key{'s' if len(keys) > 1 else ''} accepted but not implemented by tandem-rl; "
                      f"ignored: {shown}", ConfigWarning, stacklevel=2)
    try:
        return TandemConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


def _omegaconf_message(exc: OmegaConfBaseException) -> str:
    key = getattr(exc, "full_key", None)
    text = str(exc).split("\n")[0]
    return f"{key}: {text}" if key else text


def _read_source(source: str | Path | Mapping[str, Any] | None) -> DictConfig:
    if source is None:
        return OmegaConf.create({})
    if isinstance(source, Mapping):
        return OmegaConf.create(copy.deepcopy(dict(source)))
    return _read_file(Path(source))


def _read_file(path: Path, depth: int = 0) -> DictConfig:
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        loaded = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(loaded).__name__}")
    try:
        tree = OmegaConf.load(path) if loaded else OmegaConf.create({})
    except OmegaConfBaseException as exc:
        raise ConfigError(f"{path}: {_omegaconf_message(exc)}") from None
    if "defaults" in tree:
        tree = _compose(path, tree, depth)
    return tree


def _compose(path: Path, tree: DictConfig, depth: int) -> DictConfig:
    """Hydra's defaults list, for files next to the config: each entry's file merged at its package, in order;
    ``_self_`` (implicitly last) is the file's own keys."""
    if depth > 16:
        raise ConfigError(f"{path}: defaults nest too deep (a cycle?)")
    defaults = tree.pop("defaults")
    own = tree
    merged = OmegaConf.create({})
    placed_self = False
    choices: dict[str, str] = {}  # group -> the option chosen, for ``${group}`` in later entries (Hydra's rule)
    for entry in defaults if isinstance(defaults, (list, ListConfig)) else []:
        entry = OmegaConf.to_container(entry) if isinstance(entry, (DictConfig, ListConfig)) else entry
        if entry == "_self_":
            merged, placed_self = OmegaConf.merge(merged, own), True
            continue
        if isinstance(entry, str):
            group, name = "", entry
        elif isinstance(entry, dict) and len(entry) == 1:
            group, name = next(iter(entry.items()))
            group = str(group).removeprefix("override ").removeprefix("optional ").strip()
        else:
            raise ConfigError(f"{path}: defaults entry {entry!r} is neither a name nor one group: name mapping")
        if name is None:
            continue
        group, _, package = group.partition("@")
        name = re.sub(r"\$\{([\w/.]+)\}", lambda m: choices.get(m.group(1), m.group(0)), str(name))
        choices[group] = name
        folder = path.parent / group if group else path.parent
        file = (folder / f"{name}.yaml") if not str(name).startswith("/") else path.parent / f"{str(name)[1:]}.yaml"
        if not file.is_file():
            warnings.warn(f"{path}: defaults entry {entry!r} points to {file}, which does not exist; skipped",
                          ConfigWarning, stacklevel=4)
            continue
        sub = _read_file(file, depth + 1)
        header = re.search(r"^#\s*@package\s+(\S+)", file.read_text(), re.M)  # Hydra's package directive
        if not package:
            package = header.group(1) if header else group.replace("/", ".").strip(".")
        if package in ("_global_", "_here_"):
            package = ""
        if package:
            for part in reversed(package.split(".")):
                sub = OmegaConf.create({part: sub})
        merged = OmegaConf.merge(merged, sub)
    return merged if placed_self else OmegaConf.merge(merged, own)


def _parse_value(text: str) -> Any:
    try:
        return yaml.safe_load(text) if text.strip() else ""
    except yaml.YAMLError:
        return text


def _apply_override(tree: DictConfig, item: str) -> None:
    """Hydra's override forms: ``a.b=v`` (set; created when missing), ``+a.b=v`` (add; must not exist),
    ``++a.b=v`` (set or add), ``~a.b`` (delete); the value parses like a YAML scalar (``4``, ``[a,b]``, ``null``)."""
    text = item.strip()
    if text.startswith("~"):
        key = text[1:].partition("=")[0].strip()
        parent, _, leaf = key.rpartition(".")
        node = OmegaConf.select(tree, parent) if parent else tree
        if not key or not isinstance(node, DictConfig) or leaf not in node:
            raise ConfigError(f"override {item!r}: cannot delete {key!r}, it is not in the config")
        del node[leaf]
        return
    mode = "++" if text.startswith("++") else "+" if text.startswith("+") else ""
    key, sep, value_text = text[len(mode):].partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(f"override {item!r} must look like dotted.key=value")
    if mode == "+" and OmegaConf.select(tree, key, default=_ABSENT) is not _ABSENT:
        raise ConfigError(f"override {item!r}: {key} is already set; use {key}=… or ++{key}=… to change it")
    parts = key.split(".")
    node: Any = tree
    for depth, part in enumerate(parts[:-1]):
        if part not in node or node[part] is None:
            node[part] = {}
        node = node[part]
        if not isinstance(node, DictConfig):
            raise ConfigError(f"override {item!r}: {'.'.join(parts[: depth + 1])} is not a section")
    node[parts[-1]] = _parse_value(value_text)


_ABSENT = object()


def _drop_hydra_keys(value: Any) -> Any:
    """Without Hydra's instantiation keys and OmegaConf's ``???`` (a value verl leaves for the user to set)."""
    if isinstance(value, dict):
        return {k: _drop_hydra_keys(v) for k, v in value.items() if k not in HYDRA_KEYS and v != "???"}
    if isinstance(value, list):
        return [_drop_hydra_keys(v) for v in value]
    return value


def _accepts_none(annotation: Any) -> bool:
    return annotation is Any or annotation is None or type(None) in typing.get_args(annotation)


def _section_type(annotation: Any) -> type[Section] | None:
    """The Section class a field holds, if it holds one (also through ``X | None``)."""
    for candidate in (annotation, *typing.get_args(annotation)):
        if isinstance(candidate, type) and issubclass(candidate, Section):
            return candidate
    return None


def _check_keys(raw: dict[str, Any], cls: type[Section], prefix: str,
                unimplemented: dict[str, list[str]]) -> None:
    fields = cls.model_fields
    for key in list(raw):
        path = f"{prefix}{key}"
        if key in fields:
            if raw[key] is None and not _accepts_none(fields[key].annotation):
                del raw[key]  # verl's null: not set, so tandem-rl's default applies
                continue
            default = fields[key].get_default(call_default_factory=True)
            if key in cls.ONLY_DEFAULT and raw[key] != default:
                raise ConfigError(f"{path}={raw[key]!r} is not supported: {cls.ONLY_DEFAULT[key]}")
            if key in cls.NO_EFFECT and raw[key] != default:
                warnings.warn(f"{path}={raw[key]!r} has no effect in tandem-rl: {cls.NO_EFFECT[key]}; ignored",
                              ConfigWarning, stacklevel=3)
            sub = _section_type(fields[key].annotation)
            if sub is not None and isinstance(raw[key], dict):
                _check_keys(raw[key], sub, f"{path}.", unimplemented)
        elif key in cls.VERL_UNIMPLEMENTED or cls.VERL_OTHER_KEYS_UNIMPLEMENTED:
            unimplemented[prefix.rstrip(".")].append(key)
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
