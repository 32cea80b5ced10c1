"""applier/sinks/postgres_csv.py without a server: bytea's hex form, the CSV it writes, and when it refuses.

That the CSV stores what the Python rows store is checked on the real server (tests/e2e/test_pg_csv_copy.py)."""

from __future__ import annotations

import io
import random

import pyarrow as pa
import pytest

from applier.columnar import values as V
from applier.sinks import postgres as PG
from applier.sinks import postgres_csv as C
from applier.sinks.table import build_meta


def _hex(v: bytes | None) -> str | None:
    return None if v is None else "\\x" + v.hex()


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary()])
def test_hex_bytea_is_each_value_in_hex_nulls_kept(typ) -> None:
    rnd = random.Random(5)
    values = [None if rnd.random() < 0.2 else rnd.randbytes(rnd.randrange(0, 9)) for _ in range(300)]
    values[:4] = [b"", None, bytes(range(256)), b"\x00\\\n\""]
    arr = pa.array(values, typ)
    assert C.hex_bytea(arr).to_pylist() == [_hex(v) for v in values]
    for lo, n in ((1, 0), (3, 50), (7, 293), (299, 1)):  # slices: offsets into the buffers
        assert C.hex_bytea(arr.slice(lo, n)).to_pylist() == [_hex(v) for v in values[lo:lo + n]]
    chunked = pa.chunked_array([arr.slice(0, 10), arr.slice(10)])
    assert C.hex_bytea(chunked).to_pylist() == [_hex(v) for v in values]


def test_csv_quotes_every_string_and_leaves_null_empty() -> None:
    t = pa.table({"s": pa.array(["", None, "\\.", 'a"b', "x,y\nz"]), "n": pa.array([1, None, 3, 4, 5]),
                  "b": pa.array([b"\x01", None, b"", b"\xff", None])})
    got = C.csv_data(t).to_pybytes().decode()
    assert got == '"",1,"\\x01"\n,,\n"\\.",3,"\\x"\n"a""b",4,"\\xff"\n"x,y\nz",5,\n'


def _meta(oids: dict[str, int], types: dict[str, str] | None = None):
    meta = build_meta("s", "t", [(c, True, False) for c in oids], ("k",), [("k",)])
    meta.type_oids = dict(oids)
    meta.types = types or {c: "" for c in oids}
    return meta


def _adapters(meta):
    cache = PG.PostgresSink(convert=PG.pg_converter)._adapters
    return cache.row(meta, tuple(meta.columns))


def test_refusal_takes_the_listed_pairs_only() -> None:
    oids = {"k": 20, "f": 701, "d": 1700, "s": 25, "b": 17, "da": 1082, "ts": 1114, "z": 23}
    types = {"k": "bigint", "f": "double precision", "d": "numeric(14,2)", "s": "text", "b": "bytea", "da": "date",
             "ts": "timestamp(6) without time zone", "z": "integer"}
    meta = _meta(oids, types)
    kinds = {"k": V.INT, "f": V.FLOAT, "d": V.DECIMAL, "s": V.STR, "b": V.BYTES, "da": V.DATE, "ts": V.DATETIME}
    import datetime as dt
    t = pa.table({"k": pa.array([1], pa.int64()), "f": [0.5], "d": ["1.50"], "s": ["x"], "b": [b"\x00"],
                  "da": pa.array([dt.date(2020, 1, 1)]), "ts": pa.array([dt.datetime(2020, 1, 1)], pa.timestamp("us")),
                  "z": pa.nulls(1)})
    assert C.refusal(meta, t, kinds, _adapters(meta)) is None
    # a decimal's text into a text column: str(Decimal) may differ from the text (1E-7)
    m2 = _meta({**oids, "d": 25}, {**types, "d": "text"})
    assert "type oid 25" in C.refusal(m2, t, kinds, _adapters(m2))
    # a kind the table does not list, and an Arrow type the kind does not come as
    assert "lane kind None" in C.refusal(meta, t, {**kinds, "s": None}, _adapters(meta))
    t2 = t.set_column(1, "f", pa.array([0.5], pa.float32()))
    assert "float" in C.refusal(meta, t2, kinds, _adapters(meta))
    # a NUL in a string: the Python way, whose error names the row
    t3 = t.set_column(3, "s", pa.array(["a\x00b"]))
    assert "NUL" in C.refusal(meta, t3, kinds, _adapters(meta))


def test_refusal_where_a_value_converter_could_act() -> None:
    import datetime as dt
    # timestamp with time zone: naive datetimes become UTC instants (the converter acts on datetime)
    meta = _meta({"k": 20, "ts": 1114}, {"k": "bigint", "ts": "timestamp(6) with time zone"})
    t = pa.table({"k": pa.array([1], pa.int64()), "ts": pa.array([dt.datetime(2020, 1, 1)], pa.timestamp("us"))})
    assert "acts on datetime" in C.refusal(meta, t, {"k": V.INT, "ts": V.DATETIME}, _adapters(meta))
    # an ENUM column's converter acts on ints only: its names (str) pass; ordinals do not
    meta = _meta({"k": 20, "e": 25}, {"k": "bigint", "e": "enum('a','b')"})
    t = pa.table({"k": pa.array([1], pa.int64()), "e": ["a"]})
    assert C.refusal(meta, t, {"k": V.INT, "e": V.STR}, _adapters(meta)) is None
    meta = _meta({"k": 20, "e": 20}, {"k": "bigint", "e": "enum('a','b')"})
    t = pa.table({"k": pa.array([1], pa.int64()), "e": pa.array([1], pa.int64())})
    assert "acts on int" in C.refusal(meta, t, {"k": V.INT, "e": V.INT}, _adapters(meta))
    # a converter that does not say what it acts on
    sink = PG.PostgresSink(convert=lambda typ: (lambda v: v) if typ == "text" else None)
    meta = _meta({"k": 20, "s": 25}, {"k": "bigint", "s": "text"})
    t = pa.table({"k": pa.array([1], pa.int64()), "s": ["x"]})
    assert "acts on str" in C.refusal(meta, t, {"k": V.INT, "s": V.STR}, sink._adapters.row(meta, ("k", "s")))


def test_csv_round_trips_through_a_csv_reader() -> None:
    """What a CSV reader (PostgreSQL's rules: quoted = string, empty unquoted = NULL) reads back."""
    import csv
    rnd = random.Random(9)
    alphabet = ['"', ",", "\n", "\r", "\\", ".", "a", "é", "☃", " ", "\t"]
    values = ["".join(rnd.choice(alphabet) for _ in range(rnd.randrange(0, 6))) for _ in range(500)]
    t = pa.table({"s": pa.array(values)})
    rows = list(csv.reader(io.StringIO(C.csv_data(t).to_pybytes().decode(), newline="")))
    assert [r[0] for r in rows] == values
