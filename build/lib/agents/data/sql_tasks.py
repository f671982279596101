"""Text-to-SQL task rows over local SQLite files (agents layer: pure).

Each row asks one question about one database. The ``tool_agent`` explores it with the SQL tools
(``search_schema``, ``get_columns``, ``execute_sql``), whose ``create_kwargs`` carry the database path,
and answers with one SQL query; the reward compares its result with the gold query's result. As the
SQL reward (``agents.rewards.sql.score``) expects, ``ground_truth`` is the gold SQL and
``extra_info`` carries ``db_id`` and ``db_path``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from agents.data.rows import DatasetRow
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
VAL_EVERY = 5  # every fifth question of each database goes to the validation split


@dataclass(frozen=True)
class SqlTask:
    db_id: str
    question: str
    sql: str


def sql_tasks(db_id: str) -> list[SqlTask]:
    return [SqlTask(db_id, question, sql) for question, sql in QUESTIONS[db_id]]


def sql_row(task: SqlTask, db_path: str | Path, index: int, split: str) -> DatasetRow:
    """One ``tool_agent`` row; ``db_path`` is stored as given (callers pass an absolute path)."""
    db_path = str(db_path)
    system = SYSTEM_PROMPT.format(db_id=task.db_id, description=DB_DESCRIPTIONS[task.db_id])
    return DatasetRow.model_validate(
        {
            "data_source": f"sql/{task.db_id}",
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
            },
            "agent_name": "tool_agent",
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
