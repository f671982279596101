"""Dataset rows in verl's format (agents layer: pure, pydantic + pyarrow only).

A row is what verl's ``RLHFDataset`` reads from parquet, plus ``agent_name``:

    {"data_source": "openai/gsm8k", "prompt": [{"role": "user", "content": "..."}],
     "ability": "math", "reward_model": {"style": "rule", "ground_truth": "72"},
     "extra_info": {"index": 0, "question": "...", "answer": "...", "tools_kwargs": {...},
                    "split": "train"},
     "agent_name": "tool_agent"}

``load_rows`` reads parquet or jsonl and fails with the file, the row number (0-based, the same number
``extra_info.index`` and ``apply_prompt_limit`` use) and the key that was bad.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

Role = Literal["system", "user", "assistant", "tool"]


class DataError(ValueError):
    """A dataset file or row that cannot be used; the message names file, row and key."""


class ChatMessage(BaseModel):
    """One chat message. Extra keys (``tool_calls``, ``name``, ...) pass through to the template."""

    model_config = ConfigDict(extra="allow", frozen=True)

    role: Role
    content: str


class RewardSpec(BaseModel):
    """verl's ``reward_model`` column: rule-based reward against ``ground_truth``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    style: Literal["rule"] = "rule"
    ground_truth: str | dict[str, Any]
    """The answer (GSM8K: the number as a string) or a structured spec (SQL: gold query + db)."""


class ExtraInfo(BaseModel):
    """verl's ``extra_info`` column. Unknown keys are kept (verl datasets carry more)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    index: int = Field(ge=0)
    question: str
    answer: str
    split: str = "train"
    tools_kwargs: dict[str, dict[str, Any]] = Field(default_factory=dict)
    """Per tool name: ``{"create_kwargs": {...}}`` passed to that tool's ``create``."""

    @field_validator("tools_kwargs", mode="before")
    @classmethod
    def _drop_absent_tools(cls, value: Any) -> Any:
        # Parquet stores dicts as structs with the union of keys over all rows, so a tool that one
        # row does not use comes back as None; it means "no kwargs for that tool here".
        if isinstance(value, dict):
            return {name: kwargs for name, kwargs in value.items() if kwargs is not None}
        return value


class DatasetRow(BaseModel):
    """One training/validation sample (verl row + ``agent_name``)."""

    model_config = ConfigDict(extra="allow", frozen=True)

    data_source: str = Field(min_length=1)
    prompt: list[ChatMessage] = Field(min_length=1)
    ability: str
    reward_model: RewardSpec
    extra_info: ExtraInfo
    agent_name: str = Field(default="single_turn_agent", min_length=1)
    """Which agent loop runs the row; verl's default loop when the column is absent."""

    def messages(self) -> list[dict[str, Any]]:
        """The prompt as plain dicts, ready for ``apply_chat_template``."""
        return [m.model_dump(exclude_none=True) for m in self.prompt]


def _describe(error: dict[str, Any]) -> str:
    key = ".".join(str(part) for part in error["loc"])
    if error["type"] == "missing":
        return f"missing key {key!r}"
    got = error.get("input")
    return f"key {key!r}: {error['msg']} (got {type(got).__name__} {_short(got)})"


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def validate_row(raw: Any, where: str) -> DatasetRow:
    """Validate one raw row; ``where`` (e.g. ``"data/x.jsonl row 17"``) prefixes every error."""
    if not isinstance(raw, dict):
        raise DataError(f"{where}: a row must be an object, got {type(raw).__name__}")
    try:
        return DatasetRow.model_validate(raw)
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors())
        raise DataError(f"{where}: {problems}") from None


def _read_jsonl(path: Path) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        where = f"{path} row {len(out)} (line {line_no})"
        try:
            out.append((where, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise DataError(f"{where}: invalid JSON: {exc.msg} at column {exc.colno}") from None
    return out


def _read_parquet(path: Path) -> list[tuple[str, Any]]:
    records = pq.read_table(path).to_pylist()
    return [(f"{path} row {i}", record) for i, record in enumerate(records)]


def load_rows(path: str | Path) -> list[DatasetRow]:
    """Read and validate every row of a ``.parquet`` or ``.jsonl`` file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"{path}: no such file")
    readers = {".jsonl": _read_jsonl, ".parquet": _read_parquet}
    reader = readers.get(path.suffix)
    if reader is None:
        raise DataError(f"{path}: unsupported extension {path.suffix!r}, expected one of {sorted(readers)}")
    rows = reader(path)
    if not rows:
        raise DataError(f"{path}: no rows")
    return [validate_row(raw, where) for where, raw in rows]


def row_dicts(rows: list[DatasetRow]) -> list[dict[str, Any]]:
    """Plain dicts for writing; ``None`` fields are dropped so jsonl and parquet agree."""
    return [row.model_dump(mode="json", exclude_none=True) for row in rows]


def write_jsonl(rows: list[DatasetRow], path: str | Path) -> Path:
    """Write the rows to a ``.jsonl`` file, one JSON object a line, keys sorted (folders created); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(d, ensure_ascii=False, sort_keys=True) for d in row_dicts(rows)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _without_empty_dicts(value: Any) -> Any:
    # Parquet cannot store a struct with no fields, so ``{}`` is left out; for every dict field of a
    # row (``tools_kwargs``, ``create_kwargs``) absent and empty mean the same, and loading restores ``{}``.
    if isinstance(value, dict):
        pruned = {k: _without_empty_dicts(v) for k, v in value.items()}
        return {k: v for k, v in pruned.items() if v != {}}
    if isinstance(value, list):
        return [_without_empty_dicts(v) for v in value]
    return value


def write_parquet(rows: list[DatasetRow], path: str | Path) -> Path:
    """Write the rows to a ``.parquet`` file for verl and ``load_rows`` (empty dicts left out); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    records = [_without_empty_dicts(d) for d in row_dicts(rows)]
    pq.write_table(pa.Table.from_pylist(records), path)
    return path
