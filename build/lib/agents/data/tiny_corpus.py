"""The built-in corpus the tiny model's BPE tokenizer is trained on (agents layer: pure).

It covers what the tiny model will see in tests and the demo: chat turns, tool schemas and tool-call
JSON, arithmetic and GSM-style word problems (reasoning-gym, fixed seed), and SQL over the task
databases. Special tokens are left out: they are added to the tokenizer whole, never learnt as merges.
Same arguments → same texts, so the trained tokenizer is the same every time.
"""

from __future__ import annotations

import json
import random

import reasoning_gym

from agents.data.chinook_db import SCHEMA as CHINOOK_SCHEMA
from agents.data.insurance_db import SCHEMA as INSURANCE_SCHEMA
from agents.data.sql_questions import QUESTIONS

CHAT_LINES = (
    "Hello! How can I help you today?",
    "Sure, let me look that up for you.",
    "Thanks, that answers my question.",
    "I could not find a table with that name. Let me search the schema again.",
    "The query returned no rows, so I will relax the filter.",
    "Let's think step by step.",
    "First, compute the total cost. Then subtract the discount.",
    "The answer is correct. Well done!",
    "Your answer is incorrect, please check the arithmetic and try again.",
    "You are a helpful assistant. Answer the user's question concisely.",
    "Which customers bought the most tracks last year?",
    "Here is the SQL query that answers the question:",
    "Error: no such column. Use get_columns to list the columns of a table.",
)
TOOL_SCHEMAS = (
    ("execute_sql", "Run one read-only SQL query on the database and return the rows.", "query", "string"),
    ("search_schema", "Find tables and columns whose names contain a keyword.", "keyword", "string"),
    ("get_columns", "List the columns of a table with their types.", "table", "string"),
    ("calc_gsm8k_reward", "Check a proposed final answer to the math problem.", "answer", "string"),
    ("calculator", "Evaluate an arithmetic expression such as (3 + 4) * 2.", "expression", "string"),
)


def _tool_texts() -> list[str]:
    texts = []
    for name, description, arg, arg_type in TOOL_SCHEMAS:
        schema = {
            "type": "function",
            "function": {
                "name": name,
                "description": description,
                "parameters": {"type": "object", "properties": {arg: {"type": arg_type}}, "required": [arg]},
            },
        }
        texts.append(json.dumps(schema))
    return texts


def _call_texts(rng: random.Random) -> list[str]:
    sqls = [sql for pairs in QUESTIONS.values() for _, sql in pairs]
    texts = []
    for sql in sqls:
        texts.append(json.dumps({"name": "execute_sql", "arguments": {"query": sql}}))
    for table in ("customer", "policy", "claim", "claim_payment", "Track", "Album", "Invoice", "Customer"):
        texts.append(json.dumps({"name": "get_columns", "arguments": {"table": table}}))
        texts.append(json.dumps({"name": "search_schema", "arguments": {"keyword": table.lower()}}))
    for _ in range(60):
        a, b = rng.randint(1, 999), rng.randint(1, 99)
        texts.append(json.dumps({"name": "calculator", "arguments": {"expression": f"{a} * {b} + {b}"}}))
        texts.append(json.dumps({"name": "calc_gsm8k_reward", "arguments": {"answer": str(a * b + b)}}))
    return texts


def _math_texts(seed: int, count: int) -> list[str]:
    texts = []
    for name in ("gsm_symbolic", "basic_arithmetic", "chain_sum"):
        dataset = reasoning_gym.create_dataset(name, size=count, seed=seed)
        for i in range(count):
            entry = dataset[i]
            solution = entry.get("metadata", {}).get("answer_cot") or ""
            texts.append(f"{entry['question']}\n{solution}\n#### {entry['answer']}")
    return texts


def tiny_corpus(seed: int = 0, math_problems: int = 150) -> list[str]:
    """The corpus as a list of documents."""
    rng = random.Random(seed)
    questions = [question for pairs in QUESTIONS.values() for question, _ in pairs]
    return [
        *CHAT_LINES,
        *questions,
        INSURANCE_SCHEMA,
        CHINOOK_SCHEMA,
        *_tool_texts(),
        *_call_texts(rng),
        *_math_texts(seed, math_problems),
    ]
