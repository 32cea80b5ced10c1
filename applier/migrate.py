"""Create or upgrade the applier's own tables in the target with Alembic, from code (no alembic.ini)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.engine import Engine

from applier.progress import VERSION_TABLE


def script_location() -> str:
    """The migrations folder next to this package: ``applier/_migrations`` in a wheel, ``migrations/`` in a
    checkout. Only then ``applier._migrations`` as the import system finds it: an editable install maps that name to
    its own checkout's folder, so a second checkout (a git worktree) imported through PYTHONPATH would otherwise
    migrate with the first one's revisions."""
    here = Path(__file__).resolve().parent
    for folder in (here / "_migrations", here.parent / "migrations"):
        if (folder / "env.py").is_file():
            return str(folder)
    spec = importlib.util.find_spec("applier._migrations")
    if spec is not None and spec.submodule_search_locations:
        return str(Path(list(spec.submodule_search_locations)[0]))
    return str(here.parent / "migrations")


def _config() -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", script_location())
    return cfg


def upgrade(engine: Engine) -> str:
    """Bring the applier tables to the newest revision; returns it. Safe to run on every start."""
    cfg = _config()
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    return head()


def head() -> str:
    return ScriptDirectory.from_config(_config()).get_current_head() or ""


def current(engine: Engine) -> str | None:
    with engine.connect() as conn:
        return MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE}).get_current_revision()
