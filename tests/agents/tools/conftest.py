"""Fixtures: the shop database in a folder of its own."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.agents.tools.shop_db import build_shop_db


@pytest.fixture(params=["delete", "wal"])
def shop_db(request, tmp_path, monkeypatch) -> Path:
    """The shop database alone in its own folder, which is also the working directory (so a
    relative ATTACH path would land where the tests look for new files)."""
    folder = tmp_path / "db"
    folder.mkdir()
    monkeypatch.chdir(folder)
    path = build_shop_db(folder / "shop.sqlite", request.param)
    assert sorted(p.name for p in folder.iterdir()) == ["shop.sqlite"]
    return path
