"""TOOLS table and verl-style YAML tool configs."""

from __future__ import annotations

from pathlib import Path

import pytest

import agents.tools
from agents.tools.calculator import CalculatorTool
from agents.tools.gsm8k import Gsm8kTool
from agents.tools.registry import TOOLS, load_tools, resolve_class_name
from agents.tools.sql_tools import ExecuteSqlTool, GetColumnsTool, SearchSchemaTool

CONFIGS = Path(agents.tools.__file__).parent / "configs"


@pytest.mark.unit
def test_table_names_match_default_schemas():
    for name, cls in TOOLS.items():
        assert cls().name == name


@pytest.mark.unit
def test_shipped_configs_load():
    gsm8k = load_tools(CONFIGS / "gsm8k_tools.yaml")
    assert list(gsm8k) == ["calc_gsm8k_reward"] and isinstance(gsm8k["calc_gsm8k_reward"], Gsm8kTool)
    assert gsm8k["calc_gsm8k_reward"].config == {"type": "native"}
    sql = load_tools(CONFIGS / "sql_tools.yaml")
    assert [type(t) for t in sql.values()] == [SearchSchemaTool, GetColumnsTool, ExecuteSqlTool]
    assert sql["execute_sql"].max_rows == 50 and sql["execute_sql"].timeout_s == 2.0
    calc = load_tools(CONFIGS / "calculator_tools.yaml")
    assert isinstance(calc["calculator"], CalculatorTool)


@pytest.mark.unit
def test_class_name_forms():
    assert resolve_class_name("verl.tools.gsm8k_tool.Gsm8kTool") is Gsm8kTool
    assert resolve_class_name("calculator") is CalculatorTool
    assert resolve_class_name("agents.tools.sql_tools.ExecuteSqlTool") is ExecuteSqlTool


@pytest.mark.unit
def test_schema_from_config_renames_the_tool():
    schema = {"type": "function", "function": {"name": "calc", "description": "d", "parameters": {}}}
    tools = load_tools({"tools": [{"class_name": "calculator", "tool_schema": schema}]})
    assert list(tools) == ["calc"] and tools["calc"].schema == schema


@pytest.mark.unit
def test_unknown_class_name_names_entry_and_nearest():
    config = {"tools": [{"class_name": "calculator"}, {"class_name": "verl.tools.gsm8k_tool.GSM8KTool"}]}
    with pytest.raises(ValueError, match=r"tools\[1\]: unknown class_name .*nearest known name: 'verl.tools.gsm8k_tool.Gsm8kTool'"):
        load_tools(config)
    with pytest.raises(ValueError, match=r"tools\[0\]: unknown class_name 'calculater'.*'calculator'"):
        load_tools({"tools": [{"class_name": "calculater"}]})


@pytest.mark.unit
@pytest.mark.parametrize(
    "config,message",
    [
        ({"tool": []}, "'tools' must be a list"),
        ({"tools": ["calculator"]}, r"tools\[0\]: expected a mapping"),
        ({"tools": [{"class_name": "calculator", "schema": {}}]}, r"tools\[0\]: unknown keys \['schema'\]"),
        ({"tools": [{"class_name": "calculator", "config": [1]}]}, r"tools\[0\]: 'config' must be a mapping"),
        ({"tools": [{"class_name": "calculator", "tool_schema": {"type": "function"}}]}, "function.name"),
        ({"tools": [{"class_name": "calculator"}, {"class_name": "calculator"}]}, r"tools\[1\]: duplicate tool name"),
    ],
)
def test_malformed_configs(config, message):
    with pytest.raises(ValueError, match=message):
        load_tools(config)


@pytest.mark.unit
def test_yaml_file_must_be_a_mapping(tmp_path):
    path = tmp_path / "bad.yaml"
    path.write_text("- class_name: calculator\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        load_tools(path)
