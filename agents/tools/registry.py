"""Tool table and verl-style YAML tool configs (agents layer: pure).

A tool config is ``tools: [{class_name, config, tool_schema}]`` exactly as verl writes it.
``class_name`` is one of our short names (the keys of ``TOOLS``), a verl class path listed in
``VERL_ALIASES``, the dotted path of one of our classes, or, as in verl, the dotted path of the user's own
class: a ``Tool`` subclass, or a ``verl.tools.base_tool.BaseTool`` subclass run unchanged through ``VerlTool``.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from agents.tools.base import Tool
from agents.tools.calculator import CalculatorTool
from agents.tools.gsm8k import Gsm8kTool
from agents.tools.sql_tools import ExecuteSqlTool, GetColumnsTool, SearchSchemaTool

TOOLS: dict[str, type[Tool]] = {
    "calc_gsm8k_reward": Gsm8kTool,
    "calculator": CalculatorTool,
    "search_schema": SearchSchemaTool,
    "get_columns": GetColumnsTool,
    "execute_sql": ExecuteSqlTool,
}

# verl class paths -> our short name, so verl's example tool configs load unchanged.
VERL_ALIASES: dict[str, str] = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "calc_gsm8k_reward",
}

# Our own dotted class paths are accepted too (derived from TOOLS, so they cannot drift).
_OWN_PATHS: dict[str, str] = {f"{cls.__module__}.{cls.__qualname__}": name for name, cls in TOOLS.items()}


def resolve_class_name(class_name: str, where: str = "tool") -> type:
    """The tool class for ``class_name`` (ours, or a user's class by dotted path); ValueError names ``where`` and
    the nearest known name."""
    short = VERL_ALIASES.get(class_name) or _OWN_PATHS.get(class_name) or class_name
    if short in TOOLS:
        return TOOLS[short]
    user = _import_class(class_name, where) if "." in class_name else None
    if user is not None:
        return user
    known = [*TOOLS, *VERL_ALIASES, *_OWN_PATHS]
    nearest = difflib.get_close_matches(class_name, known, n=1, cutoff=0.0)
    hint = f"; nearest known name: {nearest[0]!r}" if nearest else ""
    raise ValueError(f"{where}: unknown class_name {class_name!r}{hint}")


def _import_class(path: str, where: str) -> type | None:
    """The class a dotted path names (None when its module does not import: then the name is reported unknown)."""
    import importlib
    import importlib.util

    module_name, _, attr = path.rpartition(".")
    try:
        if importlib.util.find_spec(module_name) is None:
            return None
    except ImportError:  # a parent package that does not exist
        return None
    module = importlib.import_module(module_name)  # a module that exists but fails to import says why
    cls = getattr(module, attr, None)
    if cls is None:
        raise ValueError(f"{where}: module {module_name!r} has no {attr!r}")
    from agents.tools.verl_tool import is_verl_tool_class

    if not (isinstance(cls, type) and (issubclass(cls, Tool) or is_verl_tool_class(cls))):
        raise ValueError(f"{where}: {path!r} is neither a tandem-rl Tool nor a verl BaseTool subclass")
    return cls


def _read_config(path_or_dict: str | Path | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(path_or_dict, Mapping):
        return path_or_dict
    path = Path(path_or_dict)
    loaded = yaml.safe_load(path.read_text())
    if not isinstance(loaded, Mapping):
        got = type(loaded).__name__
        raise ValueError(f"tool config {path}: expected a mapping with a 'tools' list, got {got}")
    return loaded


def _build(index: int, entry: Any, extra_config: Mapping[str, Any]) -> Tool:
    where = f"tools[{index}]"
    if not isinstance(entry, Mapping) or not isinstance(entry.get("class_name"), str):
        raise ValueError(f"{where}: expected a mapping with a string 'class_name', got {entry!r}")
    unknown = set(entry) - {"class_name", "config", "tool_schema"}
    if unknown:
        allowed = "class_name, config, tool_schema"
        raise ValueError(f"{where}: unknown keys {sorted(unknown)} (allowed: {allowed})")
    cls = resolve_class_name(entry["class_name"], where)
    config, schema = entry.get("config") or {}, entry.get("tool_schema")
    if not isinstance(config, Mapping):
        raise ValueError(f"{where}: 'config' must be a mapping, got {type(config).__name__}")
    config = {**extra_config, **config}  # tools.env under the entry's own config
    if schema is not None:
        function = schema.get("function") if isinstance(schema, Mapping) else None
        name = function.get("name") if isinstance(function, Mapping) else None
        if schema.get("type") != "function" or not isinstance(name, str) or not name:
            raise ValueError(f"{where}: tool_schema needs type: function and function.name")
    from agents.tools.verl_tool import VerlTool, is_verl_tool_class

    if is_verl_tool_class(cls):
        return VerlTool(cls, dict(config), dict(schema) if schema is not None else None, where=where)
    return cls(dict(config), dict(schema) if schema is not None else None)


def load_tools(path_or_dict: str | Path | Mapping[str, Any],
               extra_config: Mapping[str, Any] | None = None) -> dict[str, Tool]:
    """Build every tool in a verl-style tool config, keyed by the schema's function name; ``extra_config``
    (``tools.env``) goes into every tool's config, under the entry's own keys."""
    config = _read_config(path_or_dict)
    entries = config.get("tools")
    if not isinstance(entries, list):
        raise ValueError(f"tool config: 'tools' must be a list, got {type(entries).__name__}")
    tools: dict[str, Tool] = {}
    for index, entry in enumerate(entries):
        tool = _build(index, entry, extra_config or {})
        if tool.name in tools:
            raise ValueError(f"tools[{index}]: duplicate tool name {tool.name!r}")
        tools[tool.name] = tool
    return tools
