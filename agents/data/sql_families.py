"""Text-to-SQL question families: templates with typed slots filled from the databases (agents layer: pure).

A family is one question shape over one database — a question template, its gold SQL template, and a
``pick`` query that lists the slot values the database can answer (so every drawn question has an answer).
``draw_rows(families, db_paths, count, rng)`` fills the templates with values drawn by ``rng`` and keeps a
question only when its gold query runs and returns a non-trivial result, so ``apps.prepare_sql --seed N``
gives new rows of the same families for every seed.

Shapes (``SHAPES``): lookup, filter, count, 2-table join, 3-table join, group-by, group-by with HAVING,
order/limit, dates, NULLs, nested subquery. Each shape has one family on Chinook and one on the insurance
database. The held-out split is fixed by a rule chosen before any training run: for the shapes at even
positions of ``SHAPES`` the Chinook family is held out, at odd positions the insurance family — so the
held-out families share no template with training, every shape is seen in training (on the other database)
and both databases are held out about equally. Gold queries order their result only where the question asks
for an order (the reward then compares in order); elsewhere results compare as multisets.
"""

from __future__ import annotations

import random
import sqlite3
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SHAPES = ("lookup", "filter", "count", "join2", "join3", "group_by", "having", "top_k", "dates", "nulls", "nested")


@dataclass(frozen=True)
class Family:
    """One question shape over one database: the question and gold SQL templates and the ``pick`` query that lists
    slot values the database can answer."""

    name: str
    db_id: str
    shape: str
    question: str  # str.format template over the slot names
    sql: str  # str.format template; text slots are quoted by ``quote`` first (``{x}`` in the template is bare)
    pick: str  # SQL whose rows are candidate slot values, columns named as slots
    choices: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # literal slots drawn from a list

    @property
    def heldout(self) -> bool:
        return held_out(self)


def quote(value: Any) -> str:
    """A value as an SQL literal (text single-quoted with quotes doubled)."""
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    return repr(value)


MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")

FAMILIES: tuple[Family, ...] = (
    # lookup
    Family("track_composer", "chinook", "lookup",
           "Who is listed as the composer of the track '{track}'?",
           "SELECT Composer FROM Track WHERE Name = {track}",
           "SELECT Name AS track FROM Track WHERE Composer IS NOT NULL GROUP BY Name HAVING COUNT(*) = 1"),
    Family("customer_email", "insurance", "lookup",
           "What is the email address of the customer {first} {last}?",
           "SELECT email FROM customer WHERE first_name = {first} AND last_name = {last}",
           "SELECT first_name AS first, last_name AS last FROM customer GROUP BY first_name, last_name "
           "HAVING COUNT(*) = 1"),
    # filter
    Family("customers_in_country", "chinook", "filter",
           "Give the first and last names of the customers who live in {country}.",
           "SELECT FirstName, LastName FROM Customer WHERE Country = {country}",
           "SELECT DISTINCT Country AS country FROM Customer"),
    Family("policies_of_type_above_premium", "insurance", "filter",
           "Give the ids of the {ptype} policies whose annual premium is above {amount}.",
           "SELECT policy_id FROM policy WHERE policy_type = {ptype} AND annual_premium > {amount}",
           "SELECT DISTINCT policy_type AS ptype FROM policy",
           {"amount": (300, 500, 800, 1000, 1500, 2000, 3000)}),
    # count
    Family("invoices_billed_to_country", "chinook", "count",
           "How many invoices were billed to customers in {country}?",
           "SELECT COUNT(*) FROM Invoice WHERE BillingCountry = {country}",
           "SELECT DISTINCT BillingCountry AS country FROM Invoice"),
    Family("claims_of_incident_with_status", "insurance", "count",
           "How many {incident} claims have the status '{status}'?",
           "SELECT COUNT(*) FROM claim WHERE incident_type = {incident} AND status = {status}",
           "SELECT DISTINCT incident_type AS incident, status FROM claim"),
    # join over two tables
    Family("albums_of_artist", "chinook", "join2",
           "What are the titles of the albums by {artist}?",
           "SELECT al.Title FROM Album al JOIN Artist ar ON ar.ArtistId = al.ArtistId WHERE ar.Name = {artist}",
           "SELECT ar.Name AS artist FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId GROUP BY ar.Name "
           "HAVING COUNT(DISTINCT ar.ArtistId) = 1"),
    Family("policies_of_customer", "insurance", "join2",
           "Which policies does {first} {last} hold? Give each policy's id and type.",
           "SELECT p.policy_id, p.policy_type FROM policy p JOIN customer c ON c.customer_id = p.customer_id "
           "WHERE c.first_name = {first} AND c.last_name = {last}",
           "SELECT c.first_name AS first, c.last_name AS last FROM customer c JOIN policy p "
           "ON p.customer_id = c.customer_id GROUP BY c.first_name, c.last_name "
           "HAVING COUNT(DISTINCT c.customer_id) = 1"),
    # join over three tables
    Family("tracks_of_artist", "chinook", "join3",
           "List the names of all tracks by {artist}.",
           "SELECT t.Name FROM Track t JOIN Album al ON al.AlbumId = t.AlbumId JOIN Artist ar "
           "ON ar.ArtistId = al.ArtistId WHERE ar.Name = {artist}",
           "SELECT ar.Name AS artist FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId "
           "JOIN Track t ON t.AlbumId = al.AlbumId GROUP BY ar.Name HAVING COUNT(DISTINCT ar.ArtistId) = 1 "
           "AND COUNT(*) <= 40"),
    Family("claims_of_customer", "insurance", "join3",
           "List the id and claimed amount of every claim filed on a policy of {first} {last}.",
           "SELECT cl.claim_id, cl.claimed_amount FROM claim cl JOIN policy p ON p.policy_id = cl.policy_id "
           "JOIN customer c ON c.customer_id = p.customer_id WHERE c.first_name = {first} AND c.last_name = {last}",
           "SELECT c.first_name AS first, c.last_name AS last FROM customer c JOIN policy p "
           "ON p.customer_id = c.customer_id JOIN claim cl ON cl.policy_id = p.policy_id "
           "GROUP BY c.first_name, c.last_name HAVING COUNT(DISTINCT c.customer_id) = 1"),
    # group-by
    Family("tracks_per_genre_of_media_type", "chinook", "group_by",
           "For each genre, how many tracks have the media type '{media}'? Give the genre name and the count.",
           "SELECT g.Name, COUNT(*) FROM Track t JOIN Genre g ON g.GenreId = t.GenreId "
           "JOIN MediaType m ON m.MediaTypeId = t.MediaTypeId WHERE m.Name = {media} GROUP BY g.GenreId",
           "SELECT DISTINCT m.Name AS media FROM MediaType m JOIN Track t ON t.MediaTypeId = m.MediaTypeId"),
    Family("premium_per_type_in_state", "insurance", "group_by",
           "For the customers who live in the state {state}, what is the total annual premium of their policies "
           "for each policy type? Give the policy type and the total.",
           "SELECT p.policy_type, SUM(p.annual_premium) FROM policy p JOIN customer c "
           "ON c.customer_id = p.customer_id WHERE c.state = {state} GROUP BY p.policy_type",
           "SELECT DISTINCT state FROM customer"),
    # group-by with HAVING
    Family("artists_with_more_than_n_albums", "chinook", "having",
           "Which artists have more than {n} albums? Give each artist's name and number of albums.",
           "SELECT ar.Name, COUNT(*) FROM Artist ar JOIN Album al ON al.ArtistId = ar.ArtistId "
           "GROUP BY ar.ArtistId HAVING COUNT(*) > {n}",
           "SELECT 1 AS unused", {"n": (2, 3, 4, 5, 6, 8, 10)}),
    Family("customers_in_state_with_n_policies", "insurance", "having",
           "Which customers living in the state {state} hold at least {n} policies? Give the customer id and the "
           "number of policies.",
           "SELECT c.customer_id, COUNT(*) FROM customer c JOIN policy p ON p.customer_id = c.customer_id "
           "WHERE c.state = {state} GROUP BY c.customer_id HAVING COUNT(*) >= {n}",
           "SELECT DISTINCT state FROM customer", {"n": (2, 3, 4)}),
    # order / limit
    Family("longest_tracks_in_genre", "chinook", "top_k",
           "What are the {k} longest tracks in the genre '{genre}'? Give the name and length in milliseconds, "
           "longest first.",
           "SELECT t.Name, t.Milliseconds FROM Track t JOIN Genre g ON g.GenreId = t.GenreId "
           "WHERE g.Name = {genre} ORDER BY t.Milliseconds DESC LIMIT {k}",
           "SELECT g.Name AS genre FROM Genre g JOIN Track t ON t.GenreId = g.GenreId GROUP BY g.GenreId "
           "HAVING COUNT(*) >= 10",
           {"k": (3, 5, 10)}),
    Family("largest_claims_of_incident", "insurance", "top_k",
           "What are the {k} largest {incident} claims by claimed amount? Give the claim id and the claimed "
           "amount, largest first.",
           "SELECT claim_id, claimed_amount FROM claim WHERE incident_type = {incident} "
           "ORDER BY claimed_amount DESC LIMIT {k}",
           "SELECT incident_type AS incident FROM claim GROUP BY incident_type HAVING COUNT(*) >= 5",
           {"k": (2, 3, 4)}),
    # dates
    Family("invoices_in_month", "chinook", "dates",
           "How many invoices were issued in {month_name} {year}?",
           "SELECT COUNT(*) FROM Invoice WHERE strftime('%Y-%m', InvoiceDate) = {ym}",
           "SELECT DISTINCT strftime('%Y-%m', InvoiceDate) AS ym FROM Invoice"),
    Family("claimed_total_in_year", "insurance", "dates",
           "What is the total claimed amount of the {incident} claims filed in {year}?",
           "SELECT SUM(claimed_amount) FROM claim WHERE incident_type = {incident} "
           "AND strftime('%Y', claim_date) = {year}",
           "SELECT DISTINCT incident_type AS incident, strftime('%Y', claim_date) AS year FROM claim"),
    # NULLs
    Family("customers_without_company", "chinook", "nulls",
           "Which customers in {country} have no company on file? Give their first and last names.",
           "SELECT FirstName, LastName FROM Customer WHERE Country = {country} AND Company IS NULL",
           "SELECT DISTINCT Country AS country FROM Customer WHERE Company IS NULL"),
    Family("unpaid_claims_of_incident", "insurance", "nulls",
           "Which {incident} claims have no payment recorded? Give their claim ids.",
           "SELECT cl.claim_id FROM claim cl LEFT JOIN claim_payment cp ON cp.claim_id = cl.claim_id "
           "WHERE cl.incident_type = {incident} AND cp.payment_id IS NULL",
           "SELECT DISTINCT incident_type AS incident FROM claim"),
    # nested subquery
    Family("tracks_longer_than_album_average", "chinook", "nested",
           "Which tracks on the album '{album}' are longer than that album's average track length? Give their "
           "names.",
           "SELECT t.Name FROM Track t JOIN Album al ON al.AlbumId = t.AlbumId WHERE al.Title = {album} "
           "AND t.Milliseconds > (SELECT AVG(t2.Milliseconds) FROM Track t2 JOIN Album a2 "
           "ON a2.AlbumId = t2.AlbumId WHERE a2.Title = {album})",
           "SELECT al.Title AS album FROM Album al JOIN Track t ON t.AlbumId = al.AlbumId GROUP BY al.Title "
           "HAVING COUNT(DISTINCT al.AlbumId) = 1 AND COUNT(*) >= 5"),
    Family("policies_above_type_average", "insurance", "nested",
           "Which {ptype} policies have an annual premium above the average annual premium of all {ptype} "
           "policies? Give their policy ids.",
           "SELECT policy_id FROM policy WHERE policy_type = {ptype} AND annual_premium > "
           "(SELECT AVG(annual_premium) FROM policy WHERE policy_type = {ptype})",
           "SELECT DISTINCT policy_type AS ptype FROM policy"),
)
FAMILY_BY_NAME = {f.name: f for f in FAMILIES}


def held_out(family: Family) -> bool:
    """The split rule (module docstring): Chinook held out at even shape positions, insurance at odd ones."""
    return family.db_id == ("chinook" if SHAPES.index(family.shape) % 2 == 0 else "insurance")


def train_families() -> list[Family]:
    """The families training draws from: every family the split rule (``held_out``) does not hold out."""
    return [f for f in FAMILIES if not held_out(f)]


def heldout_families() -> list[Family]:
    """The held-out families (``held_out``), for validation only: none shares a template with training."""
    return [f for f in FAMILIES if held_out(f)]


@dataclass(frozen=True)
class DrawnQuestion:
    """One question drawn from a family: its text, its gold SQL and the slot values that filled both (sorted pairs)."""

    family: Family
    question: str
    sql: str
    slots: tuple[tuple[str, Any], ...]


def _derived(family: Family, slots: dict[str, Any]) -> dict[str, Any]:
    """Slots shown in a question that are spelled from another (a month name from ``YYYY-MM``)."""
    if "ym" in slots:
        year, month = str(slots["ym"]).split("-")
        return {"year": year, "month_name": MONTHS[int(month) - 1]}
    return {}


def render(family: Family, slots: Mapping[str, Any]) -> DrawnQuestion:
    """Fill ``family``'s templates with ``slots`` (and the slots spelled from them); text values quoted in the SQL."""
    values = dict(slots)
    shown = {**values, **_derived(family, values)}
    sql_values = {k: (quote(v) if isinstance(v, str) else v) for k, v in shown.items()}
    return DrawnQuestion(family, family.question.format(**shown), family.sql.format(**sql_values),
                         tuple(sorted(values.items())))


def slot_values(family: Family, conn: sqlite3.Connection) -> list[dict[str, Any]]:
    """Every slot assignment the ``pick`` query and the literal choices give, in a fixed order (not yet checked
    for an answer: ``answerable``)."""
    cursor = conn.execute(family.pick)
    names = [d[0] for d in cursor.description]
    combos = [{k: v for k, v in zip(names, row) if k != "unused"} for row in cursor.fetchall()]
    for slot, values in sorted(family.choices.items()):
        combos = [{**c, slot: v} for c in combos for v in values]
    return sorted(combos, key=lambda c: repr(sorted(c.items())))


def answerable(conn: sqlite3.Connection, sql: str) -> bool:
    """The gold runs and says something: at least one row, not a single 0 / NULL (a count of nothing)."""
    try:
        rows = conn.execute(sql).fetchall()
    except sqlite3.Error:
        return False
    if not rows:
        return False
    return not (len(rows) == 1 and all(v in (None, 0) for v in rows[0]))


def draw(families: Iterable[Family], db_paths: Mapping[str, str | Path], per_family: int, rng: random.Random,
         exclude: Collection[str] = frozenset()) -> list[DrawnQuestion]:
    """``per_family`` distinct answerable questions of each family (fewer when the database has fewer), none in
    ``exclude`` (question texts), drawn by ``rng``; families in the given order."""
    out: list[DrawnQuestion] = []
    conns: dict[str, sqlite3.Connection] = {}
    try:
        for family in families:
            if family.db_id not in conns:
                conns[family.db_id] = sqlite3.connect(f"file:{db_paths[family.db_id]}?mode=ro", uri=True)
            conn = conns[family.db_id]
            order = slot_values(family, conn)
            rng.shuffle(order)
            taken: list[DrawnQuestion] = []
            for slots in order:
                if len(taken) == per_family:
                    break
                q = render(family, slots)
                if q.question not in exclude and answerable(conn, q.sql):
                    taken.append(q)
            if not taken:
                raise ValueError(f"family {family.name!r}: no answerable question on {db_paths[family.db_id]}")
            out.extend(taken)
    finally:
        for conn in conns.values():
            conn.close()
    return out
