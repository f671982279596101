"""Builders for the small real SQLite files used by the tool and reward tests."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

CUSTOMERS = [(1, "Ada", "London"), (2, "Bo", "Paris"), (3, "Cy", "London")]
ORDERS = [
    (1, 1, 10.5, "2024-01-01"),
    (2, 1, 4.5, "2024-01-02"),
    (3, 2, 7.0, "2024-01-02"),
    (4, 3, 1.25, "2024-01-03"),
    (5, 3, 3.75, "2024-01-04"),
]


def build_shop_db(path: Path, journal_mode: str = "delete") -> Path:
    """customers(3 rows), orders(5 rows), numbers(1..100) and a view; closed and checkpointed."""
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA journal_mode={journal_mode}")
    conn.executescript(
        """
        CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT NOT NULL, city TEXT);
        CREATE TABLE orders (id INTEGER PRIMARY KEY, customer_id INTEGER REFERENCES customers(id),
                             amount REAL, day TEXT);
        CREATE TABLE numbers (x INTEGER);
        CREATE INDEX orders_by_customer ON orders(customer_id);
        CREATE VIEW big_orders AS SELECT id, amount FROM orders WHERE amount > 5;
        """
    )
    conn.executemany("INSERT INTO customers VALUES (?, ?, ?)", CUSTOMERS)
    conn.executemany("INSERT INTO orders VALUES (?, ?, ?, ?)", ORDERS)
    conn.executemany("INSERT INTO numbers VALUES (?)", [(i,) for i in range(1, 101)])
    conn.commit()
    conn.close()
    return path


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()
