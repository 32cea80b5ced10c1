"""``applier load`` of exports that the real Dumpling never writes: a value its column cannot hold in the target, a
value that is not valid for its type, syntax that is not Dumpling's. Each is written with the project's export
writer (applier/devtools/dumpling.py), which can put exactly that into an export; a real TiDB and the real
Dumpling cover the load of real exports and the changefeed after it (tests/e2e/test_tidb_load.py). Each stops the
load naming file and line (a refused row: exit 4 and its key; a bad value or syntax: exit 2) with nothing loaded and
the password never shown.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import create_engine, select

from applier import progress as P
from applier.cli import main
from applier.devtools.dumpling import DumpTable, write_export
from tests.e2e.helpers import target_url, write_toml

pytestmark = pytest.mark.e2e

UP = "up"


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_a_row_the_target_refuses_stops_the_load_naming_file_line_and_key(urls, unique, drop_schema, tmp_path,
                                                                            capsys, target) -> None:
    schema = f"seedbad_{unique}"
    drop_schema((target, schema))
    url = target_url(urls, target)
    engine = create_engine(url)
    q = '`' if target == "mariadb" else '"'
    with engine.begin() as c:  # the target exists already, with a column narrower than upstream's
        c.exec_driver_sql(f"CREATE {'DATABASE' if target == 'mariadb' else 'SCHEMA'} {q}{schema}{q}")
        c.exec_driver_sql(f"CREATE TABLE {q}{schema}{q}.{q}t{q} (id int PRIMARY KEY, c varchar(3))")
    rows = [{"id": i, "c": "ok"} for i in range(1, 301)]
    rows[211]["c"] = "too long"
    types = {"id": "int", "c": "varchar(64)"}
    write_export(tmp_path / "export", [DumpTable(UP, "t", types, rows)], snapshot_ts=1 << 60, statement_rows=50)
    cfg = {
        "pipeline": {"name": f"p-bad-{unique}", "checkpoint_dir": str(tmp_path / "ckpt")},
        "source": {"bootstrap_servers": urls.kafka, "topics": ["none"], "protocol": "canal-json"},
        "target": {"url": url},
        "route": [{"match": f"{UP}.*", "schema": schema}],
    }
    conf = str(write_toml(tmp_path / "c.toml", cfg))
    try:
        assert main(["load", "-c", conf, "--dumpling", str(tmp_path / "export")]) == 4
        err = capsys.readouterr().err
        # the row with id 212 is on line 3 (SET NAMES, FOREIGN_KEY_CHECKS) + 4 INSERT lines + its row: 3 + 4 + 212
        assert "up.t.000000000.sql, line 219" in err and "id=212" in err and "Nothing of" in err, err
        assert f":{engine.url.password}@" not in err  # (the local services' user and password are both 'applier')
        with engine.connect() as c:
            assert c.exec_driver_sql(f"SELECT count(*) FROM {q}{schema}{q}.{q}t{q}").scalar() == 0
            assert c.execute(select(P.pipelines).where(P.pipelines.c.pipeline == cfg["pipeline"]["name"])).first() \
                is None
    finally:
        engine.dispose()


@pytest.mark.parametrize("target", ["mariadb", "postgres"])
def test_an_export_that_is_not_dumplings_syntax_or_values_stops_with_exit_2(urls, unique, drop_schema, tmp_path,
                                                                             capsys, target) -> None:
    schema = f"seedsyn_{unique}"
    drop_schema((target, schema))
    types = {"id": "int", "d": "date"}
    files = write_export(tmp_path / "export", [DumpTable(UP, "t", types, [{"id": i, "d": dt.date(2024, 1, i)}
                                                                          for i in range(1, 21)])],
                         snapshot_ts=1 << 60, statement_rows=10)
    cfg = {
        "pipeline": {"name": f"p-syn-{unique}", "checkpoint_dir": str(tmp_path / "ckpt")},
        "source": {"bootstrap_servers": urls.kafka, "topics": ["none"], "protocol": "canal-json"},
        "target": {"url": target_url(urls, target)},
        "route": [{"match": f"{UP}.*", "schema": schema}],
    }
    conf = str(write_toml(tmp_path / "c.toml", cfg))
    data = files[0].read_bytes()
    files[0].write_bytes(data.replace(b"'2024-01-15'", b"'2024-02-30'"))  # line 19: 2 comment lines, an INSERT line, 10 rows, the 2nd INSERT line, then rows 11..
    assert main(["load", "-c", conf, "--dumpling", str(tmp_path / "export")]) == 2
    err = capsys.readouterr().err
    assert "up.t.000000000.sql, line 19: column 'd' (date)" in err and "'2024-02-30'" in err, err
    files[0].write_bytes(data.replace(b"(15,", b"(15 "))  # a missing comma
    assert main(["load", "-c", conf, "--dumpling", str(tmp_path / "export"), "--replace"]) == 2
    err = capsys.readouterr().err
    assert "up.t.000000000.sql, line 19: expected a row of values" in err and "Nothing of" in err, err
    engine = create_engine(target_url(urls, target))
    try:
        with engine.connect() as c:  # the table was created (from the export's CREATE TABLE), and nothing loaded
            q = '`' if target == "mariadb" else '"'
            assert c.exec_driver_sql(f"SELECT count(*) FROM {q}{schema}{q}.{q}t{q}").scalar() == 0
            assert c.execute(select(P.loads).where(P.loads.c.pipeline == cfg["pipeline"]["name"])).first() is None
    finally:
        engine.dispose()
