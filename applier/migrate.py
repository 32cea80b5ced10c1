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
    """The migrations folder: packaged as ``applier._migrations`` in a wheel, or ``migrations/`` in a checkout."""
    spec = importlib.util.find_spec("applier._migrations")
    if spec is not None and spec.submodule_search_locations:
        return str(Path(list(spec.submodule_search_locations)[0]))
    return str(Path(__file__).resolve().parents[1] / "migrations")


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
