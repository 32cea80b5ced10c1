"""``applier migrate`` against a real target: it creates or upgrades the applier's tables and says where, with
the password masked (it once crashed after migrating, calling a property as a function)."""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, inspect

from applier.cli import main
from tests.e2e.helpers import config, target_url, write_toml

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_migrate_creates_the_tables_and_names_the_target_without_its_password(urls, unique, tmp_path, capsys,
                                                                               target) -> None:
    conf = write_toml(tmp_path / "c.toml", config(urls, target, "open", f"mig-{unique}", f"mig_{unique}",
                                                  tmp_path / "ck"))
    assert main(["migrate", "-c", str(conf)]) == 0
    out = capsys.readouterr().out
    assert "applier tables at revision 0012 in " in out and "***" in out and ":applier@" not in out, out
    engine = create_engine(target_url(urls, target))
    try:
        assert "applier_quarantined_rows" in inspect(engine).get_table_names()
    finally:
        engine.dispose()
