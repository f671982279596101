"""A deterministic synthetic insurance database (agents layer: pure, stdlib sqlite3).

Four tables with foreign keys: customer → policy → claim → claim_payment. Every value comes from one
``random.Random(seed)`` and rows are inserted in a fixed order, so the same seed gives the same rows
and the same file bytes.
"""

from __future__ import annotations

import datetime as dt
import random
import sqlite3
from pathlib import Path

SCHEMA = """
CREATE TABLE customer (
    customer_id INTEGER PRIMARY KEY,
    first_name TEXT NOT NULL,
    last_name TEXT NOT NULL,
    date_of_birth TEXT NOT NULL,
    email TEXT NOT NULL UNIQUE,
    city TEXT NOT NULL,
    state TEXT NOT NULL,
    signup_date TEXT NOT NULL
);
CREATE TABLE policy (
    policy_id INTEGER PRIMARY KEY,
    customer_id INTEGER NOT NULL REFERENCES customer(customer_id),
    policy_type TEXT NOT NULL CHECK (policy_type IN ('auto', 'home', 'life', 'health', 'travel')),
    start_date TEXT NOT NULL,
    end_date TEXT NOT NULL,
    annual_premium REAL NOT NULL,
    coverage_amount REAL NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('active', 'lapsed', 'cancelled'))
);
CREATE TABLE claim (
    claim_id INTEGER PRIMARY KEY,
    policy_id INTEGER NOT NULL REFERENCES policy(policy_id),
    claim_date TEXT NOT NULL,
    incident_type TEXT NOT NULL,
    claimed_amount REAL NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('open', 'approved', 'denied', 'paid'))
);
CREATE TABLE claim_payment (
    payment_id INTEGER PRIMARY KEY,
    claim_id INTEGER NOT NULL REFERENCES claim(claim_id),
    payment_date TEXT NOT NULL,
    amount REAL NOT NULL,
    method TEXT NOT NULL CHECK (method IN ('bank_transfer', 'check', 'card'))
);
CREATE INDEX policy_customer ON policy(customer_id);
CREATE INDEX claim_policy ON claim(policy_id);
CREATE INDEX payment_claim ON claim_payment(claim_id);
"""

FIRST_NAMES = (
    "Alice Bruno Carmen Dmitri Elena Farah Gustavo Hana Ivan Julia Kofi Lena Mateo Nadia Oscar Priya "
    "Quentin Rosa Samir Tara Umar Vera Wei Ximena Yusuf Zoe"
).split()
LAST_NAMES = (
    "Garcia Smith Novak Okafor Tanaka Rossi Muller Silva Kowalski Haddad Nguyen Larsen Petrov Moreau "
    "Ibrahim Chen Fischer Lopez Kim Andersen"
).split()
CITIES = (
    ("Austin", "TX"), ("Dallas", "TX"), ("Denver", "CO"), ("Boston", "MA"), ("Seattle", "WA"),
    ("Portland", "OR"), ("Miami", "FL"), ("Orlando", "FL"), ("Chicago", "IL"), ("Phoenix", "AZ"),
)
# (policy_type, premium range, coverage range, incident types)
POLICY_KINDS = (
    ("auto", (400, 1800), (10_000, 60_000), ("collision", "theft", "glass", "vandalism")),
    ("home", (600, 2500), (100_000, 600_000), ("fire", "water damage", "storm", "burglary")),
    ("life", (200, 1500), (50_000, 500_000), ("death",)),
    ("health", (1200, 6000), (20_000, 200_000), ("hospitalization", "surgery", "outpatient")),
    ("travel", (50, 400), (2_000, 20_000), ("trip cancellation", "lost luggage", "medical abroad")),
)
N_CUSTOMERS = 120
N_POLICIES = 220
N_CLAIMS = 160
EPOCH = dt.date(2019, 1, 1)


def _day(rng: random.Random, start: dt.date, span_days: int) -> dt.date:
    return start + dt.timedelta(days=rng.randrange(span_days))


def _customers(rng: random.Random) -> list[tuple]:
    rows = []
    for cid in range(1, N_CUSTOMERS + 1):
        first, last = rng.choice(FIRST_NAMES), rng.choice(LAST_NAMES)
        city, state = rng.choice(CITIES)
        born = _day(rng, dt.date(1950, 1, 1), 365 * 52)
        signup = _day(rng, EPOCH, 365 * 2)
        email = f"{first.lower()}.{last.lower()}{cid}@example.com"
        rows.append((cid, first, last, born.isoformat(), email, city, state, signup.isoformat()))
    return rows


def _policies(rng: random.Random) -> list[tuple]:
    rows = []
    for pid in range(1, N_POLICIES + 1):
        # The first N_CUSTOMERS policies give every customer at least one policy.
        cid = pid if pid <= N_CUSTOMERS else rng.randint(1, N_CUSTOMERS)
        kind, premium, coverage, _ = rng.choice(POLICY_KINDS)
        start = _day(rng, EPOCH, 365 * 5)
        end = start + dt.timedelta(days=365 * rng.choice((1, 1, 2, 3)))
        status = rng.choices(("active", "lapsed", "cancelled"), weights=(7, 2, 1))[0]
        rows.append((
            pid, cid, kind, start.isoformat(), end.isoformat(),
            round(rng.uniform(*premium), 2), float(rng.randrange(coverage[0], coverage[1], 1000)), status,
        ))
    return rows


def _claims(rng: random.Random, policies: list[tuple]) -> list[tuple]:
    incidents = {kind: types for kind, _, _, types in POLICY_KINDS}
    rows = []
    for claim_id in range(1, N_CLAIMS + 1):
        pid, _, kind, start, end, _, coverage, _ = rng.choice(policies)
        span = (dt.date.fromisoformat(end) - dt.date.fromisoformat(start)).days
        when = _day(rng, dt.date.fromisoformat(start), span)
        amount = round(rng.uniform(0.01, 0.4) * coverage, 2)
        status = rng.choices(("open", "approved", "denied", "paid"), weights=(2, 2, 2, 4))[0]
        rows.append((claim_id, pid, when.isoformat(), rng.choice(incidents[kind]), amount, status))
    return rows


def _payments(rng: random.Random, claims: list[tuple]) -> list[tuple]:
    rows = []
    for claim_id, _, when, _, amount, status in claims:
        if status not in ("approved", "paid"):
            continue
        # Paid claims are settled in full over 1-3 instalments; approved ones have a first part.
        parts = rng.randint(1, 3) if status == "paid" else 1
        share = 1.0 if status == "paid" else rng.uniform(0.2, 0.6)
        day = dt.date.fromisoformat(when)
        for part in range(parts):
            day += dt.timedelta(days=rng.randint(5, 60))
            value = round(amount * share / parts, 2)
            method = rng.choice(("bank_transfer", "bank_transfer", "check", "card"))
            rows.append((len(rows) + 1, claim_id, day.isoformat(), value, method))
    return rows


def insurance_rows(seed: int = 0) -> dict[str, list[tuple]]:
    """All rows per table, in insertion order."""
    rng = random.Random(seed)
    customers = _customers(rng)
    policies = _policies(rng)
    claims = _claims(rng, policies)
    return {
        "customer": customers,
        "policy": policies,
        "claim": claims,
        "claim_payment": _payments(rng, claims),
    }


def build_insurance_db(path: str | Path, seed: int = 0) -> Path:
    """Write the database to ``path`` (replacing it); same seed → same bytes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.execute("PRAGMA foreign_keys = ON")
        conn.executescript(SCHEMA)
        for table, rows in insurance_rows(seed).items():
            marks = ",".join("?" * len(rows[0]))
            conn.executemany(f"INSERT INTO {table} VALUES ({marks})", rows)
        conn.commit()
    finally:
        conn.close()
    return path
