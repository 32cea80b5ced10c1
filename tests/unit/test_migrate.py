"""Which migrations ``applier migrate`` runs: those next to the imported package (issue 26 added 0012 in a git
worktree, where the editable install's ``applier._migrations`` named the main checkout's folder, one revision
short)."""

from __future__ import annotations

from pathlib import Path

from applier import migrate

CHECKOUT = Path(__file__).resolve().parents[2]


def test_the_migrations_are_this_checkouts() -> None:
    assert Path(migrate.script_location()) == CHECKOUT / "migrations"


def test_head_is_the_newest_revision_file() -> None:
    newest = max(p.name for p in (CHECKOUT / "migrations" / "versions").glob("[0-9]*.py"))
    assert migrate.head() == newest.split("_", 1)[0]
