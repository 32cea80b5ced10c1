"""The LOAD DATA LOCAL upsert path's pure parts (applier.sinks.mysql_load), no database: the file it writes for every
value type (read back here with LOAD DATA's own unescaping rules), the column kinds and load modes, the chunks it
leaves to executemany, the statements, the file guard (with a fake connection) and ``[target] load_data``."""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal
from typing import Any

import pymysql
import pytest
from pymysql.protocol import MysqlPacket
from sqlalchemy import create_engine
from sqlalchemy.dialects import mysql as sa_mysql

from applier.config import ConfigError, parse_config
from applier.sinks import mysql_load as L
from applier.sinks.table import build_meta

UTC = dt.timezone.utc


# ---- a reader of LOAD DATA's text format (FIELDS TERMINATED BY TAB ESCAPED BY '\\' LINES TERMINATED BY LF) ----

_UNESCAPE = {ord("0"): 0, ord("b"): 8, ord("n"): 10, ord("r"): 13, ord("t"): 9, ord("Z"): 26}


def read_file(data: bytes) -> list[list[bytes | None]]:
    """The rows as the server reads them: each field's bytes, None for a field that is exactly ``\\N``."""
    assert data.endswith(b"\n")
    rows: list[list[bytes | None]] = []
    row: list[bytes | None] = []
    field = bytearray()
    null = False
    i = 0
    while i < len(data):
        b = data[i]
        if b == 0x5C:  # the escape character
            nxt = data[i + 1]
            if nxt == ord("N") and not field and data[i + 2:i + 3] in (b"\t", b"\n"):
                null = True
            else:
                field.append(_UNESCAPE.get(nxt, nxt))
            i += 2
            continue
        if b in (0x09, 0x0A):
            row.append(None if null else bytes(field))
            field, null = bytearray(), False
            if b == 0x0A:
                rows.append(row)
                row = []
        else:
            field.append(b)
        i += 1
    return rows


def fields(kind: str | None, values: list[Any]) -> tuple[list[bytes | None], str]:
    """One column through encode_rows and back through the reader."""
    enc = L.encode_rows([kind], ["c"], [{"c": v} for v in values])
    assert enc is not None
    rows = read_file(enc.data)
    assert all(len(r) == 1 for r in rows) and len(rows) == len(values)
    return [r[0] for r in rows], enc.modes[0]


def refused(kind: str | None, values: list[Any]) -> bool:
    return L.encode_rows([kind], ["c"], [{"c": v} for v in values]) is None


# ---- column kinds -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("column_type, kind", [
    ("int(11)", "integer"), ("bigint(20) unsigned", "integer"), ("tinyint(1)", "integer"), ("decimal(65,30)", "decimal"),
    ("double", "float"), ("float unsigned", "float"), ("varchar(64)", "char"), ("longtext", "char"), ("json", "char"),
    ("varbinary(16)", "binary"), ("longblob", "binary"), ("datetime(6)", "datetime"), ("timestamp(6)", "datetime"),
    ("date", "datetime"), ("time(6)", "time"), ("year(4)", "year"), ("bit(64)", "bit"), ("enum('a','b')", "enum"),
    ("set('x','y')", "set"), ("geometry", None), ("inet6", None), (None, None), ("", None),
])
def test_column_kinds(column_type, kind) -> None:
    assert L.column_kind(column_type) == kind


# ---- the file, value type by value type ---------------------------------------------------------------------

def test_integers_as_digits_bools_as_one_and_zero_unsigned_bigint_max_and_null() -> None:
    got, mode = fields("integer", [0, -1, 2**64 - 1, -2**63, True, False, None, 7])
    assert got == [b"0", b"-1", b"18446744073709551615", b"-9223372036854775808", b"1", b"0", None, b"7"]
    assert mode == "text"


def test_floats_as_their_repr_and_non_finite_ones_are_left_to_executemany() -> None:
    got, _ = fields("float", [0.1, -0.0, 1e300, 3.4028234663852886e+38, 5e-324, None, 2])
    assert got == [b"0.1", b"-0.0", b"1e+300", b"3.4028234663852886e+38", b"5e-324", None, b"2"]
    for bad in (float("inf"), float("-inf"), float("nan")):
        assert refused("float", [1.5, bad])


def test_decimals_keep_their_scale_and_never_use_an_exponent() -> None:
    got, _ = fields("decimal", [Decimal("1.250"), Decimal("-0.01"), Decimal("1E+3"), Decimal("1.5E-7"),
                                Decimal("-0"), None, Decimal("99999999999999999999.999999999999999999999999999999")])
    assert got == [b"1.250", b"-0.01", b"1000", b"0.00000015", b"-0", None,
                   b"99999999999999999999.999999999999999999999999999999"]
    got, _ = fields("decimal", [Decimal("2.50"), 3, True])  # mixed types: value by value, as PyMySQL writes each
    assert got == [b"2.50", b"3", b"1"]
    for bad in (Decimal("NaN"), Decimal("sNaN"), Decimal("Infinity"), Decimal("-Infinity")):
        assert refused("decimal", [Decimal("1"), bad])


def test_datetimes_with_microseconds_dates_and_zero_dates_as_text() -> None:
    got, _ = fields("datetime", [dt.datetime(2020, 1, 2, 3, 4, 5), dt.datetime(2020, 1, 2, 3, 4, 5, 6),
                                 dt.datetime(1, 1, 1), dt.datetime(9999, 12, 31, 23, 59, 59, 999999), None])
    assert got == [b"2020-01-02 03:04:05", b"2020-01-02 03:04:05.000006", b"0001-01-01 00:00:00",
                   b"9999-12-31 23:59:59.999999", None]
    got, _ = fields("datetime", [dt.date(2024, 2, 29), dt.date(1, 1, 1), "0000-00-00 00:00:00", "2024-00-00", None])
    assert got == [b"2024-02-29", b"0001-01-01", b"0000-00-00 00:00:00", b"2024-00-00", None]


def test_an_aware_datetime_is_written_by_its_fields_as_pymysql_does() -> None:
    aware = dt.datetime(2020, 1, 2, 3, 4, 5, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    got, _ = fields("datetime", [aware, dt.datetime(2020, 1, 2, 3, 4, 5, 7, tzinfo=UTC), None])
    assert got == [b"2020-01-02 03:04:05", b"2020-01-02 03:04:05.000007", None]
    assert pymysql.converters.escape_datetime(aware) == "'2020-01-02 03:04:05'"


def test_times_as_text_negative_time_text_included() -> None:
    got, _ = fields("time", ["-838:59:59", "838:59:59.000000", "100:00:00.500000", dt.time(1, 2, 3, 4), None])
    assert got == [b"-838:59:59", b"838:59:59.000000", b"100:00:00.500000", b"01:02:03.000004", None]


STRINGS = ["plain", "tab\there", "line\nbreak", "back\\slash", "NULL", "\\N", "N", "", "\\", "\\\\N", "\r\x1a\x08",
           "zoë", "李", "😀 four bytes", "trailing\\", "\t", "\n", "a\tb\nc\\d"]


def test_strings_come_back_exactly_with_every_special_byte_escaped() -> None:
    got, mode = fields("char", STRINGS + [None])
    assert got == [s.encode() for s in STRINGS] + [None]
    assert mode == "text"


def test_the_text_null_and_backslash_n_stay_strings_and_empty_is_not_null() -> None:
    got, _ = fields("char", ["NULL", "\\N", "", None])
    assert got == [b"NULL", b"\\N", b"", None]


def test_strings_with_nul_or_u0001_are_written_value_by_value() -> None:
    values = ["a\x00b", "\x01", "x\ty", None, "\x00\x01\\"]
    got, _ = fields("char", values)
    assert got == [v.encode() if v is not None else None for v in values]


def test_a_lone_surrogate_is_left_to_executemany_which_refuses_it_too() -> None:
    assert refused("char", ["ok", "\udc80"])
    with pytest.raises(UnicodeEncodeError):
        "\udc80".encode("utf-8")  # PyMySQL encodes the query text so (no surrogateescape)


def test_json_text_is_a_string() -> None:
    doc = '{"a": "x\\ty", "b": [1, 2.5, null], "c": "\\u00e9\\n"}'
    got, _ = fields("char", [doc])
    assert got == [doc.encode()]


def test_bytes_go_as_hex_and_come_back_byte_exact() -> None:
    values = [b"\x00\x5c\x09\x0a", b"\xff\xfe\x80", b"", bytes(range(256)), None]
    got, mode = fields("binary", values)
    assert mode == "hex"
    assert [None if g is None else bytes.fromhex(g.decode()) for g in got] == values
    got, mode = fields("binary", ["text into varbinary"])  # a str: its UTF-8, as a literal would give
    assert (got, mode) == ([b"text into varbinary"], "text")
    assert refused("binary", [b"x", "y"])


def test_enum_set_and_bit_integers_are_cast_through_a_variable() -> None:
    for kind in ("enum", "set", "bit"):
        got, mode = fields(kind, [2, 0, None, True, 2**64 - 1])
        assert (got, mode) == ([b"2", b"0", None, b"1", b"18446744073709551615"], "uint")
    assert fields("enum", ["2", "b", None]) == ([b"2", b"b", None], "text")  # names are names
    assert fields("bit", [b"\x01\x00"])[1] == "hex"
    assert refused("enum", [1, "b"])  # index and name in one column: no one mode reads both
    assert refused("bit", ["1"])


def test_year_integers_are_cast_signed_so_that_zero_stays_0000() -> None:
    assert fields("year", [0, 1999, None]) == ([b"0", b"1999", None], "int")
    assert fields("year", ["0"]) == ([b"0"], "text")


@pytest.mark.parametrize("kind, values", [
    ("decimal", [1.5]), ("integer", [Decimal("1")]), ("integer", [1.0]), ("datetime", [20240101]),
    ("char", [5]), ("char", [b"x"]), ("float", [Decimal("1.5")]), ("time", [dt.timedelta(seconds=1)]),
    (None, ["x"]), ("integer", [bytearray(b"1")]), ("char", [memoryview(b"x")]),
])
def test_a_value_type_not_written_exactly_leaves_the_chunk_to_executemany(kind, values) -> None:
    assert refused(kind, values + [None])


def test_an_all_null_column_of_any_type_is_all_backslash_n() -> None:
    assert fields(None, [None, None]) == ([None, None], "text")


def test_bulk_and_value_by_value_forms_agree() -> None:
    """Columns of one type take C-level shortcuts; they must write what the value-by-value form (the reference,
    mixing in a second type forces it) writes."""
    rnd = random.Random(25)
    makers = {
        "integer": lambda: rnd.choice([rnd.randrange(-2**63, 2**64), rnd.randrange(-9, 9)]),
        "float": lambda: rnd.choice([rnd.uniform(-1, 1) * 1e308, rnd.random(), float(rnd.randrange(-99, 99))]),
        "decimal": lambda: Decimal(rnd.randrange(-10**20, 10**20)).scaleb(-rnd.randrange(0, 40)),
        "datetime": lambda: dt.datetime(1, 1, 1) + dt.timedelta(microseconds=rnd.randrange(0, 10**17)) if rnd.random() < .5
        else dt.datetime(2000, 1, 1) + dt.timedelta(seconds=rnd.randrange(0, 10**9)),
        "char": lambda: "".join(rnd.choice("ab\t\n\\Nzë李😀") for _ in range(rnd.randrange(0, 6))),
    }
    for kind, make in makers.items():
        for _ in range(30):
            values = [make() if rnd.random() < .8 else None for _ in range(rnd.randrange(1, 40))]
            bulk = L.column_texts(values, kind)
            reference = [None if v is None else L._TEXT_OF[type(v)](v) for v in values]
            assert bulk is not None
            assert bulk[0] == [L.NULL if r is None else r for r in reference], kind


def test_a_chunk_of_many_columns_keeps_rows_and_columns_apart() -> None:
    cols = ("id", "s", "b", "e", "d")
    kinds = ("integer", "char", "binary", "enum", "datetime")
    rows = [{"id": i, "s": ["a\tb", None, "x\ny", "\\"][i % 4], "b": [b"\t\n", None][i % 2], "e": [1, None, 3][i % 3],
             "d": dt.datetime(2020, 1, 1, 0, 0, i)} for i in range(10)]
    enc = L.encode_rows(kinds, cols, rows)
    assert enc is not None and enc.modes == ("text", "text", "hex", "uint", "text")
    back = read_file(enc.data)
    assert len(back) == 10
    for r, f in zip(rows, back):
        assert f == [str(r["id"]).encode(), None if r["s"] is None else r["s"].encode(),
                     None if r["b"] is None else r["b"].hex().encode(), None if r["e"] is None else str(r["e"]).encode(),
                     str(r["d"]).encode()]
    one = L.encode_rows(("char",), ("k",), [{"k": "x"}, {"k": ""}])  # one column: a row may be an empty line
    assert one is not None and one.data == b"x\n\n"
    assert L.encode_rows(kinds, cols, []) is None


# ---- statements ---------------------------------------------------------------------------------------------

PREP = sa_mysql.dialect().identifier_preparer


def test_the_load_statement_has_no_backslash_and_casts_through_variables() -> None:
    before, after = L.load_statement(PREP, "`applier_load_1`", ("id", "we`ird", "e", "b 100%", "y"),
                                     ("text", "hex", "uint", "text", "int"))
    sql = before + "'/tmp/f.tsv'" + after
    assert "\\" not in sql
    # identifiers quoted by SQLAlchemy (a % doubled: the statement goes through PyMySQL's % formatting)
    assert sql == ("LOAD DATA LOCAL INFILE '/tmp/f.tsv' INTO TABLE `applier_load_1` CHARACTER SET utf8mb4 FIELDS "
                   "TERMINATED BY X'09' ENCLOSED BY '' ESCAPED BY X'5C' LINES STARTING BY '' TERMINATED BY X'0A' "
                   "(id, @applier_1, @applier_2, `b 100%%`, @applier_4) SET `we``ird` = UNHEX(@applier_1), "
                   "e = CAST(@applier_2 AS UNSIGNED), y = CAST(@applier_4 AS SIGNED)")


def _meta(key: tuple[str, ...], cols: tuple[str, ...]):
    return build_meta("s", "t%x", [(c, c not in key, False) for c in cols], key, [key])


def test_the_merge_is_todays_upsert_from_the_stage_in_file_order() -> None:
    sql = L.merge_statement(PREP, _meta(("id",), ("id", "v", "select")), "`applier_load_1`", "_applier_seq",
                            ("id", "v", "select"))
    assert sql == ("INSERT INTO s.`t%%x` (id, v, `select`) SELECT id, v, `select` FROM `applier_load_1` "
                   "ORDER BY _applier_seq ON DUPLICATE KEY UPDATE v = VALUES(v), `select` = VALUES(`select`)")
    key_only = L.merge_statement(PREP, _meta(("a", "b"), ("a", "b")), "`st`", "_applier_seq", ("a", "b"))
    assert key_only.endswith("ON DUPLICATE KEY UPDATE a = VALUES(a)")


def test_the_stage_is_made_in_the_dialects_engine() -> None:
    from applier.dialect import MARIADB, MYSQL

    meta = _meta(("id",), ("id", "v"))
    aria = L.create_statement(PREP, meta, "`applier_load_1`", "_applier_seq", ("id", "v"), "Aria")
    assert aria == ("CREATE TEMPORARY TABLE `applier_load_1` (_applier_seq BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY)"
                    " ENGINE=Aria SELECT id, v FROM s.`t%%x` LIMIT 0")
    default = L.create_statement(PREP, meta, "`applier_load_1`", "_applier_seq", ("id", "v"), None)
    assert " ENGINE=" not in default and default.endswith("SELECT id, v FROM s.`t%%x` LIMIT 0")
    assert MARIADB.writer().load_data.stage_engine == "Aria"
    assert MYSQL.writer().load_data.stage_engine is None


def test_a_file_name_that_would_need_escaping_is_not_used() -> None:
    assert L.path_literal("/tmp/applier-load-x.tsv") == "'/tmp/applier-load-x.tsv'"
    for bad in ("/tmp/it's/f", "/tmp/back\\slash/f", "/tmp/new\nline/f", "/tmp/100%/f"):
        assert L.path_literal(bad) is None


# ---- the file guard ---------------------------------------------------------------------------------------

def _ok_packet(rows: int, warnings: int) -> bytes:
    """An OK packet's payload: header, affected rows, insert id, status, warnings."""
    return bytes([0, rows, 0]) + (2).to_bytes(2, "little") + warnings.to_bytes(2, "little")


class FakeConnection:
    """What PyMySQL's LOCAL INFILE answer uses of a connection: packets out, one packet in."""

    def __init__(self, reply: bytes) -> None:
        self.sent: list[bytes] = []
        self.reply = reply
        self._local_infile = True
        self.max_allowed_packet = 16 * 1024 * 1024
        self.applier_allowed_file: bytes | None = None
        self.applier_load_result = None

    def write_packet(self, data: bytes) -> None:
        self.sent.append(bytes(data))

    def _read_packet(self, packet_type=MysqlPacket) -> MysqlPacket:
        return packet_type(self.reply, "utf8")


def _request(conn: FakeConnection, path: str) -> None:
    L._GuardedResult(conn)._read_load_local_packet(MysqlPacket(b"\xfb" + path.encode(), "utf8"))


def test_the_guard_refuses_a_request_outside_the_writers_load_and_sends_nothing_of_the_file() -> None:
    conn = FakeConnection(_ok_packet(0, 0))
    with pytest.raises(L.LocalFileRefused, match="/etc/passwd.* while no LOAD DATA of the applier was running"):
        _request(conn, "/etc/passwd")
    assert conn.sent == [b""]  # an empty file ends the server's request: the connection stays in step


def test_the_guard_refuses_another_path_than_the_one_just_written(tmp_path) -> None:
    mine = tmp_path / "mine.tsv"
    mine.write_bytes(b"1\n")
    conn = FakeConnection(_ok_packet(0, 0))
    conn.applier_allowed_file = str(mine).encode()
    with pytest.raises(L.LocalFileRefused, match="instead of the file the applier had just written") as info:
        _request(conn, str(mine) + ".other")
    assert info.value.args[0] == L.CR_LOAD_DATA_LOCAL_INFILE_REJECTED
    assert conn.sent == [b""] and conn.applier_allowed_file is None  # the permission is spent either way
    with pytest.raises(L.LocalFileRefused):  # and not reusable for the right path afterwards
        _request(conn, str(mine))


def test_the_guard_sends_exactly_the_permitted_file_once_and_keeps_the_counts(tmp_path) -> None:
    mine = tmp_path / "mine.tsv"
    mine.write_bytes(b"1\tx\n2\ty\n")
    conn = FakeConnection(_ok_packet(2, 1))
    conn.applier_allowed_file = str(mine).encode()
    _request(conn, str(mine))
    assert conn.sent == [b"1\tx\n2\ty\n", b""]
    assert conn.applier_load_result == (2, 1)
    assert conn.applier_allowed_file is None


def test_the_guarded_connection_class_overrides_pymysqls_hooks() -> None:
    assert L.LoadDataConnection._read_query_result is not pymysql.connections.Connection._read_query_result
    assert L._GuardedResult._read_load_local_packet is not pymysql.connections.MySQLResult._read_load_local_packet


def test_enable_local_infile_makes_guarded_connections_with_local_infile() -> None:
    engine = create_engine("mysql+pymysql://u:p@127.0.0.1:1/db")
    L.enable_local_infile(engine)
    made: list[tuple] = []
    (listener,) = list(engine.dialect.dispatch.do_connect)
    original = L.LoadDataConnection
    try:
        L.LoadDataConnection = lambda *a, **kw: made.append((a, kw)) or "conn"  # type: ignore[assignment]
        assert listener(engine.dialect, None, (), {"host": "h", "local_infile": False}) == "conn"
    finally:
        L.LoadDataConnection = original  # type: ignore[misc]
    assert made == [((), {"host": "h", "local_infile": True})]
    with pytest.raises(ValueError, match="pymysql driver"):
        L.enable_local_infile(create_engine("postgresql+psycopg://u@h/db"))


# ---- [target] load_data -------------------------------------------------------------------------------------

def _settings(url: str, **target):
    return parse_config({
        "pipeline": {"name": "p", "checkpoint_dir": "/tmp/applier-test-ckpt"},
        "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "protocol": "canal-json"},
        "target": {"url": url, **target},
    }, env={})


MARIA = "mariadb+pymysql://u:s3cretpw@127.0.0.1:3306/db"
PG = "postgresql+psycopg://u:s3cretpw@127.0.0.1:5432/db"


def test_load_data_defaults_to_auto_and_takes_on_and_off() -> None:
    s = _settings(MARIA)
    assert s.target.load_data == "auto" and s.target.uses_load_data
    assert s.redacted()["target"]["load_data"] == "auto"
    assert _settings(MARIA, load_data="on").target.uses_load_data
    assert not _settings(MARIA, load_data="off").target.uses_load_data
    assert _settings("mysql+pymysql://u@h/db", load_data="on").target.uses_load_data


def test_load_data_refuses_an_unknown_value_naming_the_key() -> None:
    with pytest.raises(ConfigError) as info:
        _settings(MARIA, load_data="yes")
    assert info.value.key == "target.load_data" and "auto, on, off" in info.value.message
    with pytest.raises(ConfigError, match="expected a string"):
        _settings(MARIA, load_data=True)


def test_postgres_ignores_auto_and_off_and_refuses_on() -> None:
    assert not _settings(PG).target.uses_load_data
    assert not _settings(PG, load_data="off").target.uses_load_data
    with pytest.raises(ConfigError) as info:
        _settings(PG, load_data="on")
    assert info.value.key == "target.load_data" and "MySQL/MariaDB" in info.value.message
    assert "s3cretpw" not in str(info.value)


def test_make_engine_enables_local_infile_only_for_runs_that_use_it() -> None:
    from applier.pipeline import make_engine

    def listeners(engine) -> int:
        return len(list(engine.dialect.dispatch.do_connect))

    assert listeners(make_engine(_settings(MARIA))) == 0  # status, migrate, verify, load, ...
    assert listeners(make_engine(_settings(MARIA), load_data=True)) == 1  # applier run
    assert listeners(make_engine(_settings(MARIA, load_data="off"), load_data=True)) == 0
    assert listeners(make_engine(_settings(PG), load_data=True)) == 0
