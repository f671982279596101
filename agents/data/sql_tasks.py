"""Text-to-SQL task rows over local SQLite files (agents layer: pure).

Each row asks one question about one database. The ``tool_agent`` explores it with the SQL tools
(``search_schema``, ``get_columns``, ``execute_sql``), whose ``create_kwargs`` carry the database path,
and answers with one SQL query; the reward compares its result with the gold query's result. As the
SQL reward (``agents.rewards.sql.score``) expects, ``ground_truth`` is the gold SQL and
``extra_info`` carries ``db_id`` and ``db_path``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from pathlib import Path

from agents.data.rows import DatasetRow
from agents.data.sql_families import DrawnQuestion, draw, heldout_families, train_families
from agents.data.sql_questions import QUESTIONS

SQL_TOOLS = ("search_schema", "get_columns", "execute_sql")
DB_DESCRIPTIONS = {
    "insurance": "an insurance company's customers, policies, claims and claim payments",
    "chinook": "a digital music store (artists, albums, tracks, playlists, customers, invoices)",
}
SYSTEM_PROMPT = (
    "You answer questions about the SQLite database `{db_id}`: {description}. "
    "Use the tools to look up tables and columns and to run read-only queries. "
    "When you are confident, reply with the single SQL query that answers the question "
    "in a ```sql code block."
)
SCHEMA_SECTION = "\n\nTables (name(column type, ...), PK = primary key):\n{schema}"
VAL_EVERY = 5  # every fifth question of each database goes to the validation split


def schema_text(db_path: str | Path) -> str:
    """The database's tables, one line each: ``Album(AlbumId INTEGER PK, Title NVARCHAR(160), ArtistId INTEGER)``.

    Put in the system prompt (``schema_in_prompt``), it saves the exploring turns, and it is the prompt prefix every
    question of that database shares (the engines' prefix cache computes it once)."""
    from agents.tools.sql import read_schema

    lines = []
    for table in read_schema(db_path):
        cols = ", ".join(f"{c.name} {c.type}".rstrip() + (" PK" if c.primary_key else "") for c in table.columns)
        lines.append(f"{table.name}({cols})")
    return "\n".join(lines)


@dataclass(frozen=True)
class SqlTask:
    """One question about one database with its gold SQL; ``data_source``, ``family`` and ``shape`` are set for
    questions drawn from a family."""

    db_id: str
    question: str
    sql: str
    data_source: str = ""  # default: sql/<db_id>
    family: str = ""
    shape: str = ""
    description: str = ""  # default: DB_DESCRIPTIONS[db_id]


def sql_tasks(db_id: str) -> list[SqlTask]:
    """The hand-written question / gold SQL pairs of ``db_id`` (``agents.data.sql_questions``) as tasks."""
    return [SqlTask(db_id, question, sql) for question, sql in QUESTIONS[db_id]]


def sql_row(task: SqlTask, db_path: str | Path, index: int, split: str, schema: str | None = None,
            agent_name: str = "tool_agent") -> DatasetRow:
    """One row for ``agent_name`` (``tool_agent``, or ``langgraph_sql``: the LangGraph agent through the OpenAI
    endpoint); ``db_path`` is stored as given (callers pass an absolute path). ``schema`` (``schema_text``) is
    appended to the system prompt."""
    db_path = str(db_path)
    system = SYSTEM_PROMPT.format(db_id=task.db_id, description=task.description or DB_DESCRIPTIONS[task.db_id])
    if schema:
        system += SCHEMA_SECTION.format(schema=schema)
    return DatasetRow.model_validate(
        {
            "data_source": task.data_source or f"sql/{task.db_id}",
            "prompt": [{"role": "system", "content": system}, {"role": "user", "content": task.question}],
            "ability": "sql",
            "reward_model": {
                "style": "rule",
                "ground_truth": task.sql,
            },
            "extra_info": {
                "index": index,
                "question": task.question,
                "answer": task.sql,
                "split": split,
                "db_id": task.db_id,
                "db_path": db_path,
                "tools_kwargs": {tool: {"create_kwargs": {"db_path": db_path}} for tool in SQL_TOOLS},
                **({"family": task.family, "shape": task.shape} if task.family else {}),
            },
            "agent_name": agent_name,
        }
    )


def sql_splits(db_paths: dict[str, Path]) -> dict[str, list[DatasetRow]]:
    """Train and val rows over every database in ``db_paths``; the split is fixed per question."""
    chosen: dict[str, list[SqlTask]] = {"train": [], "val": []}
    for db_id in sorted(db_paths):
        for i, task in enumerate(sql_tasks(db_id)):
            chosen["val" if i % VAL_EVERY == VAL_EVERY - 1 else "train"].append(task)
    return {
        split: [sql_row(task, db_paths[task.db_id], index, split) for index, task in enumerate(tasks)]
        for split, tasks in chosen.items()
    }


# Data sources of the family splits: sql/<group>:<family>; validation also reports each group (orchestration.validation).
TRAIN_GROUP, SAME_GROUP, HELDOUT_GROUP = "sql/train", "sql/same_family", "sql/heldout_family"


def _task(drawn: DrawnQuestion, group: str) -> SqlTask:
    family = drawn.family
    return SqlTask(family.db_id, drawn.question, drawn.sql, f"{group}:{family.name}", family.name, family.shape)


def family_splits(db_paths: dict[str, Path], seed: int, *, train_per_family: int = 16, same_per_family: int = 2,
                  heldout_per_family: int = 3, schema_in_prompt: bool = False,
                  agent_name: str = "tool_agent") -> dict[str, list[DatasetRow]]:
    """Rows of the question families (``agents.data.sql_families``), slot values drawn with ``seed``:

    - ``train``: ``train_per_family`` questions of each training family;
    - ``val_same_family``: ``same_per_family`` other questions of each training family (drawn first, so no
      training question repeats one);
    - ``val_heldout_family``: ``heldout_per_family`` questions of each held-out family (no template in common
      with training).
    Families with fewer answerable questions give what they have (training gets what validation left).
    ``schema_in_prompt``: each row's system prompt lists its database's tables (``schema_text``); ``agent_name``: the
    agent loop every row names."""
    rng = random.Random(seed)
    same = draw(train_families(), db_paths, same_per_family, rng)
    train = draw(train_families(), db_paths, train_per_family, rng, exclude={q.question for q in same})
    heldout = draw(heldout_families(), db_paths, heldout_per_family, rng)
    rng.shuffle(train)
    tasks = {"train": [_task(q, TRAIN_GROUP) for q in train],
             "val_same_family": [_task(q, SAME_GROUP) for q in same],
             "val_heldout_family": [_task(q, HELDOUT_GROUP) for q in heldout]}
    schemas = {db_id: schema_text(path) if schema_in_prompt else None for db_id, path in db_paths.items()}
    return {split: [sql_row(task, db_paths[task.db_id], i, split, schemas[task.db_id], agent_name)
                    for i, task in enumerate(chosen)]
            for split, chosen in tasks.items()}
