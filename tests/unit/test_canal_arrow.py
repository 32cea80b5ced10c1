"""The columnar lane's Canal-JSON decoder and gate against the per-record path (issue 25, point 7).

``CanalJSONDecoder.decode_arrow`` must give, for every slice it takes, exactly the events ``decode`` gives record by
record (and take none it cannot give exactly); the gate holding row batches must release, window by window, the
same changes in the same order as the gate holding events, with the same restart offsets.
"""

from __future__ import annotations

import collections
import random
from decimal import Decimal

import orjson
import pyarrow as pa
import pytest

from applier.clock import clock_limit
from applier.codecs import get_decoder
from applier.columnar import values as V
from applier.columnar.apply import window_events
from applier.decode import decode_messages
from applier.events import DecodeError, KafkaMessage, Resolved, RowChange
from applier.gate import row_identity
from tests.e2e import ticdc_real
from tests.unit.arrow_lane import bench_messages, gate_differential, per_partition, slices

LIMIT = clock_limit(None)
TOPIC = "t"


def _bench_messages(events: int = 3000, seed: int = 1) -> list[KafkaMessage]:
    return bench_messages("canal-json", events, seed, TOPIC)


def _with_watermarks(msgs: list[KafkaMessage], every: int) -> list[KafkaMessage]:
    """``msgs`` with a TIDB_WATERMARK after every ``every`` records of each partition, each as high as the stream
    allows there (one below the lowest commit ts still to come in that partition), offsets renumbered: so that
    releases cut through held row batches."""
    out = []
    for part, ms in per_partition(msgs).items():
        ts = [orjson.loads(m.value).get("_tidb", {}).get("commitTs") for m in ms]
        low_after = [0] * len(ms)
        low = None
        for i in range(len(ms) - 1, -1, -1):
            low_after[i] = low
            if ts[i] is not None and not orjson.loads(ms[i].value).get("isDdl"):
                low = ts[i] if low is None else min(low, ts[i])
        off = 0
        for i, m in enumerate(ms):
            out.append(KafkaMessage(m.topic, part, off, m.key, m.value))
            off += 1
            if (i + 1) % every == 0 and low_after[i] is not None:
                wm = {"id": 0, "database": "", "table": "", "pkNames": None, "isDdl": False, "type": "TIDB_WATERMARK",
                      "es": 0, "ts": 0, "sql": "", "sqlType": None, "mysqlType": None, "data": None, "old": None,
                      "_tidb": {"watermarkTs": low_after[i] - 1}}
                out.append(KafkaMessage(m.topic, part, off, None, orjson.dumps(wm)))
                off += 1
    return out


def _record_by_record(msgs: list[KafkaMessage]) -> list:
    return decode_messages(get_decoder("canal-json"), msgs, stop_at_error=True).events


def _checkslices(slices: list[list[KafkaMessage]]) -> tuple[int, int]:
    dec = get_decoder("canal-json")
    taken = refused = 0
    for s in slices:
        got = dec.decode_arrow(s, LIMIT)
        if got is None:
            refused += 1
            continue
        taken += 1
        assert got.messages == len(s)
        assert got.to_events() == _record_by_record(s)
    return taken, refused


def test_bench_stream_every_row_slice_is_taken_and_equal():
    msgs = _bench_messages()
    taken, refused = _checkslices(slices(msgs, 64))
    assert taken > 40 and refused == 0  # DDL messages are kept as events in their place


@pytest.mark.parametrize("variant", ["canal-json", "canal-json-index-value"])
def test_real_ticdc_stream_equal_where_taken(variant):
    msgs = ticdc_real.messages(variant, TOPIC)
    taken, _ = _checkslices(slices(msgs, 1) + slices(msgs, 5))
    assert taken > 10  # the lane takes plain rows of TiCDC's own encoder


_ODD_TEXT = [" 5", "5_0", "+7", "٣", "1e999", "nan", "-0", "00012", "0000-00-00 00:00:00", "2024-02-30 00:00:00",
             "2024-02-29 23:59:59.5", "2023-02-29", "24:00:00", "2024-01-01 24:00:00", "2024-01-01", "9999-12-31",
             "0001-01-01 00:00:00.000001", "1.10", "-0.00", ".5", "5.", "1e3", "", "abc", "\u00ff\u00fe", "\u0100",
             "18446744073709551615", "18446744073709551616", "-9223372036854775809", "NULL", None, 5, 1.5, True,
             ["x"], {"a": 1}]


def _mutate(rng: random.Random, value: bytes) -> bytes:
    obj = orjson.loads(value)
    if obj.get("isDdl") or obj.get("type") == "TIDB_WATERMARK":
        return value
    how = rng.randrange(10)
    rows = obj.get("data") or [{}]
    row = rng.choice(rows + (obj.get("old") or []))
    if how <= 4 and row:
        row[rng.choice(list(row))] = rng.choice(_ODD_TEXT)
    elif how == 5 and row:
        del row[rng.choice(list(row))]
    elif how == 6 and row:
        items = list(row.items())
        rng.shuffle(items)
        row.clear()
        row.update(items)
    elif how == 7:
        obj["_tidb"]["commitTs"] = rng.choice([-1, 2 ** 63, "1", 1.0, None])
    elif how == 8:
        obj[rng.choice(["data", "old", "mysqlType", "sqlType", "pkNames", "type", "database"])] = rng.choice(
            [None, [], {}, "x", 1, [None]])
    else:
        obj["_tidb"][rng.choice(["onlyHandleKey", "claimCheckLocation"])] = rng.choice([True, "s3://x", 1, ""])
    return orjson.dumps(obj)


def test_mutated_messages_are_refused_or_equal():
    rng = random.Random(7)
    msgs = [m for m in _bench_messages(1500) if m.partition == 0][:400]
    dec = get_decoder("canal-json")
    taken = 0
    for trial in range(400):
        s = list(msgs[rng.randrange(0, len(msgs) - 8):][:8])
        i = rng.randrange(len(s))
        m = s[i]
        s[i] = KafkaMessage(m.topic, m.partition, m.offset, m.key, _mutate(rng, m.value))
        got = dec.decode_arrow(s, LIMIT)
        try:
            want = _record_by_record(s)
        except DecodeError:
            assert got is None, f"trial {trial}: the lane took a slice the decoder refuses"
            continue
        if got is not None:
            taken += 1
            assert got.to_events() == want, f"trial {trial}"
    assert taken > 50


def _raw_variants(value: bytes) -> list[bytes]:
    """Byte-level edits of one row message where msgspec (the lane's parse) and orjson (the record path's) could
    part: duplicate keys, integers beyond 64 bits, floats and booleans for integers, bad UTF-8, surrogates,
    trailing data."""
    obj = orjson.loads(value)
    ts = obj["_tidb"]["commitTs"]
    col = next(iter(obj["mysqlType"]))
    text = value.decode()
    first = text.index("{") + 1
    end_sql = text.index("}", text.index('"sqlType":{'))

    def sql_code(code: bytes) -> bytes:  # the first column's sqlType, again as the map's last key (the one read)
        return value[:end_sql] + f',"{col}":'.encode() + code + value[end_sql:]
    out = [
        value[:first] + b'"type":"DELETE",' + value[first:],  # a duplicate key before: the last one counts
        value[:-1] + b',"type":"DELETE"}',  # and after
        value[:-1] + b',"data":null}',
        value[:-1] + b',"_tidb":{"commitTs":1}}',
        value[:-1] + b',"isDdl":true}',
        value[:-1] + b',"isDdl":null}',
        value + b" x", value + b"\n", b" " + value,
        value.replace(str(ts).encode(), str(ts).encode() + b".0"),
        value.replace(str(ts).encode(), b"18446744073709551617"),
        value.replace(str(ts).encode(), b"true"),
        *(sql_code(code) for code in (b"true", b"4.0", b"9223372036854775808", b"18446744073709551616", b"-1")),
        value.replace(b'"mysqlType":{', b'"mysqlType":{"zz":"int",'),
        value.replace(b'"data":[{', b'"data":[{"zz":"1",'),
        value.replace(b'"data":[{', f'"data":[{{"{col}":"\\ud800",'.encode()),
        value.replace(b'"data":[{', f'"data":[{{"{col}":"\xff",'.encode("latin-1")),
        value.replace(b'"data":[{', f'"data":[{{"{col}":5,'.encode()),
        value.replace(b'"pkNames":', b'"pkNames":[1],"x":'),
        value.replace(b'"database":"', b'"database":null,"y":"'),
    ]
    return [v for v in out if v != value]


def test_raw_edits_are_refused_or_equal():
    msgs = [m for m in _bench_messages(600) if m.partition == 0][20:60]
    rows = [i for i, m in enumerate(msgs) if b'"isDdl":false' in m.value and b'"sqlType":{' in m.value]
    dec = get_decoder("canal-json")
    seen = collections.Counter(_variant_in_place(dec, msgs, i, raw) for i in rows[:6] for raw in _raw_variants(
        msgs[i].value))
    assert seen["taken"] and seen["refused"]


def _variant_in_place(dec, msgs: list[KafkaMessage], i: int, raw: bytes, again: bool = False) -> str:
    """``msgs[i]`` replaced by ``raw`` in a slice of its neighbours, through the lane and the record path: the lane
    refuses what the record path refuses, and what it takes it gives as the record path does ("taken", "refused" or
    "left" to the record path). ``again``: the same slice a second time must be taken alike."""
    s = list(msgs[max(0, i - 3):i + 3])
    at = s.index(msgs[i])
    m = s[at]
    s[at] = KafkaMessage(m.topic, m.partition, m.offset, m.key, raw)
    got = dec.decode_arrow(s, LIMIT)
    try:
        want = _record_by_record(s)
    except DecodeError:
        assert got is None, raw
        return "refused"
    if got is None:
        return "left"
    assert got.to_events() == want, raw
    if again:
        second = dec.decode_arrow(s, LIMIT)
        assert second is not None and second.to_events() == want, raw
    return "taken"


def _map_variants(value: bytes, rng: random.Random) -> list[bytes]:
    """One row message with its mysqlType and sqlType maps written otherwise: what TiCDC does (its mysqlType comes
    from a Go map, in a new order each message), what parses to the same maps, and what does not."""
    obj = orjson.loads(value)
    mysql, sql = obj["mysqlType"], obj["sqlType"]
    col = next(iter(mysql))
    other = {"bigint": "int", "int unsigned": "bigint unsigned"}.get(mysql[col], "bigint")

    def with_maps(m, q, raw_m: bytes | None = None, raw_q: bytes | None = None) -> bytes:
        o = dict(obj, mysqlType="@M", sqlType="@Q")
        text = orjson.dumps(o)
        text = text.replace(b'"@M"', raw_m if raw_m is not None else orjson.dumps(m))
        return text.replace(b'"@Q"', raw_q if raw_q is not None else orjson.dumps(q))

    def shuffled(d: dict) -> dict:
        items = list(d.items())
        rng.shuffle(items)
        return dict(items)
    dumped = orjson.dumps(mysql).decode()
    out = [with_maps(shuffled(mysql), sql) for _ in range(3)] + [
        with_maps(mysql, shuffled(sql)),
        with_maps(mysql, sql, raw_m=b"{ " + orjson.dumps(mysql)[1:-1].replace(b",", b" , ") + b" }"),
        with_maps(mysql, sql, raw_m=dumped.replace(  # a value's first letter escaped
            f'"{col}":"{mysql[col]}"', f'"{col}":"\\u{ord(mysql[col][0]):04x}{mysql[col][1:]}"').encode()),
        with_maps(mysql, sql, raw_m=("{" + f'"{col}":"{other}",' + dumped[1:]).encode()),  # duplicate: last counts
        with_maps(mysql, sql, raw_m=(dumped[:-1] + f',"{col}":"{other}"' + "}").encode()),
        with_maps(dict(mysql, **{col: other}), sql),
        with_maps(dict(mysql, zz="int"), sql),
        with_maps({k: v for k, v in mysql.items() if k != col}, sql),
        with_maps(mysql, dict(sql, **{col: (sql[col] or 0) + 1})),
        with_maps(mysql, {k: v for k, v in sql.items() if k != col}),
        with_maps(mysql, sql, raw_q=b"null"),
        with_maps(mysql, sql, raw_q=b"{}"),
        with_maps(mysql, sql, raw_q=orjson.dumps(sql).replace(f'"{col}":{sql[col]}'.encode(),
                                                            f'"{col}":{sql[col]}.0'.encode())),
        with_maps(mysql, sql, raw_m=b"null"),
        with_maps(mysql, sql, raw_m=b"{}"),
    ]
    return [v for v in out if v != value]


def test_map_texts_against_known_shapes_are_refused_or_equal():
    """The lane matches a message's maps against the shapes it has seen by their raw text
    (applier.codecs.canal_maps): every other text for the same maps, and every text for other maps, must give what
    the record path gives, or leave the slice to it. One decoder throughout, so the shapes are known."""
    rng = random.Random(13)
    msgs = [m for m in _bench_messages(600) if m.partition == 0][20:80]
    rows = [i for i, m in enumerate(msgs) if b'"isDdl":false' in m.value and b'"sqlType":{' in m.value]
    dec = get_decoder("canal-json")
    assert dec.decode_arrow(msgs, LIMIT) is not None
    seen = collections.Counter(_variant_in_place(dec, msgs, i, raw, again=True) for i in rows[:12]
                               for raw in _map_variants(msgs[i].value, rng))
    assert seen["taken"] > 12 * 10 and seen["refused"]


def test_untrusted_ts_is_left_to_the_record_path():
    msgs = [m for m in _bench_messages(600) if m.partition == 0][20:40]
    dec = get_decoder("canal-json")
    assert dec.decode_arrow(msgs, LIMIT) is not None
    assert dec.decode_arrow(msgs, 1) is None


# ---- values ---------------------------------------------------------------------------------------------------

from applier import mysql_values as T  # noqa: E402


@pytest.mark.parametrize("kind, conv, texts", [
    (V.DATETIME, T.parse_datetime, ["2024-02-29 23:59:59", "2024-01-01 00:00:00.5", "0001-01-01 00:00:00.000001",
                                    "9999-12-31 23:59:59.999999", None]),
    (V.DATE, T.parse_date, ["2024-02-29", "0001-01-01", "9999-12-31", None]),
    (V.DECIMAL, T.parse_decimal, ["1.10", "-0.00", "12345678901234567890.123456789", "0", None]),
    (V.FLOAT, T.parse_float, ["1.5", "-0", "1e300", "3.4028235e+38", "0.1", None]),
    (V.INT, T.parse_int, ["0", "-9223372036854775808", "9223372036854775807", None]),
    (V.INT, T.parse_int, ["18446744073709551615", "1"]),
])
def test_values_give_what_the_converter_gives(kind, conv, texts):
    arr = V.column_array(kind, conv, texts)
    got = V.to_python(kind, conv, arr)
    want = [None if t is None else conv(t) for t in texts]
    assert [(type(g), g) for g in got] == [(type(w), w) for w in want]
    if kind == V.DECIMAL:
        assert [str(g) for g in got if g is not None] == [str(w) for w in want if w is not None]


@pytest.mark.parametrize("kind, conv, text", [
    (V.DATETIME, T.parse_datetime, "0000-00-00 00:00:00"), (V.DATETIME, T.parse_datetime, "2024-02-30 00:00:00"),
    (V.DATETIME, T.parse_datetime, "2024-01-01 24:00:00"), (V.DATETIME, T.parse_datetime, "2024-01-01"),
    (V.DATETIME, T.parse_datetime, "2024-01-01T00:00:00"), (V.DATETIME, T.parse_datetime, "2024-01-01 00:00:00.1234567"),
    (V.DATETIME, T.parse_datetime, "0000-01-01 00:00:00"), (V.DATE, T.parse_date, "2023-02-29"),
    (V.DATE, T.parse_date, "0000-00-00"), (V.DATE, T.parse_date, "2024-1-01"), (V.DECIMAL, T.parse_decimal, "1e3"),
    (V.DATETIME, T.parse_datetime, "2023-02-29 00:00:00"), (V.DATETIME, T.parse_datetime, "2024-04-31 12:00:00"),
    (V.DATETIME, T.parse_datetime, "2024-01-01 00:00:60"), (V.DATETIME, T.parse_datetime, "2024-01-01 00:60:00"),
    (V.DATE, T.parse_date, "1900-02-29"),
    (V.DECIMAL, T.parse_decimal, " 1"), (V.DECIMAL, T.parse_decimal, "NaN"), (V.FLOAT, T.parse_float, "inf"),
    (V.FLOAT, T.parse_float, "1e999"), (V.INT, T.parse_int, "18446744073709551616"),
])
def test_values_refuse_what_they_cannot_give_exactly(kind, conv, text):
    with pytest.raises((V.Refused, ValueError)):
        V.column_array(kind, conv, [text])


_NUMBER_ALPHABET = "0123456789" * 6 + "-+._ eExX\u0663\uff10in"


@pytest.mark.parametrize("kind, conv", [(V.INT, T.parse_int), (V.FLOAT, T.parse_float)])
def test_arrow_numbers_are_the_converters_numbers(kind, conv):
    """Random spellings through column_array (Arrow's cast where it takes them): each value is what the converter
    gives, or the column is refused where the converter refuses one of its values."""
    rng = random.Random(11)
    checked = 0
    for _ in range(3000):
        texts = ["".join(rng.choice(_NUMBER_ALPHABET) for _ in range(rng.randrange(1, 6))) for _ in range(3)]
        texts.append(rng.choice(["12", "-7", "0.5", None]))
        try:
            want = [None if t is None else conv(t) for t in texts]
        except (ValueError, TypeError, ArithmeticError):
            want = None
        try:
            got = V.to_python(kind, conv, V.column_array(kind, conv, texts, texts=True))
        except (V.Refused, ValueError, TypeError, ArithmeticError):
            got = None
        if got is not None:
            assert want is not None, texts
            assert [(type(g), g) for g in got] == [(type(w), w) for w in want], texts
            checked += 1
    assert checked > 100


def test_decimal_keeps_its_scale():
    arr = V.column_array(V.DECIMAL, T.parse_decimal, ["1.500"])
    assert V.to_python(V.DECIMAL, T.parse_decimal, arr) == [Decimal("1.500")]
    assert str(V.to_python(V.DECIMAL, T.parse_decimal, arr)[0]) == "1.500"


# ---- the gate with row batches ----------------------------------------------------------------------------------

@pytest.mark.parametrize("seed, budget", [(1, 512 * 1024 * 1024), (2, 64 * 1024), (3, 1)])
def test_gate_with_batches_releases_what_the_event_gate_releases(seed, budget, tmp_path):
    def same(got: list, want: list) -> None:
        assert got == want

    gate_differential("canal-json", _with_watermarks(_bench_messages(4000, seed), 23), random.Random(seed), budget,
                      tmp_path, most=400, slice_size=97, same=same)


@pytest.mark.parametrize("seed", range(5))
def test_temporal_values_through_numpy_equal_to_pylist(seed):
    """to_python's numpy route for dates and datetimes gives what pyarrow's to_pylist gives, nulls and the range's
    ends included (with nulls, a plain to_numpy made floats of the int64 values: 9999-12-31 23:59:59.999999 came
    back as an int)."""
    import datetime as dt

    rng = random.Random(seed)
    stamps = [None if rng.random() < 0.2 else dt.datetime(1, 1, 1) + dt.timedelta(
        microseconds=rng.randrange(0, 315537897600000000)) for _ in range(300)]
    stamps += [dt.datetime(9999, 12, 31, 23, 59, 59, 999999), dt.datetime(1, 1, 1), None]
    days = [None if rng.random() < 0.2 else dt.date.fromordinal(rng.randrange(1, 3652060)) for _ in range(300)]
    for kind, typ, vals in ((V.DATETIME, pa.timestamp("us"), stamps), (V.DATE, pa.date32(), days)):
        arr = pa.array(vals, typ)
        got = V.to_python(kind, None, arr)
        assert got == arr.to_pylist() == vals
        assert [type(g) for g in got] == [type(v) for v in vals]


@pytest.mark.parametrize("seed", range(20))
def test_drop_copies_keeps_the_first_of_each_identity(seed):
    from applier.columnar.held import drop_copies

    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randrange(2, 200)):
        if rows and rng.random() < 0.2:
            rows.append(dict(rng.choice(rows), pos=len(rows)))  # a copy: same identity, another position
        else:
            rows.append({"_ts": rng.randrange(3), "_op": rng.randrange(3), "k": rng.choice([None, 1, 2, 3]),
                         "v": rng.choice([None, "a", "b"]), "pos": len(rows)})
    table = pa.Table.from_pylist(rows)
    seen, want = set(), []
    for r in rows:
        ident = (r["_ts"], r["_op"], r["k"], r["v"])
        if ident not in seen:
            seen.add(ident)
            want.append(r["pos"])
    for probe in (None, ["_ts", "_op", "k"]):
        got, dropped = drop_copies(table, ["_ts", "_op", "k", "v"], probe)
        assert got.column("pos").to_pylist() == want
        assert dropped == len(rows) - len(want)


def _merged_rows(msgs: list[KafkaMessage], most: int = 4) -> list[KafkaMessage]:
    """Consecutive row messages of one partition with the same table, type, commit ts and types merged into one
    message with several rows (``data`` and ``old`` lists), offsets renumbered: what Canal's format allows and
    TiCDC's own encoder does not write."""
    out: list[KafkaMessage] = []
    for part, ms in per_partition(msgs).items():
        merged: list[dict] = []
        for m in ms:
            o = orjson.loads(m.value)
            prev = merged[-1] if merged else None
            same = (prev is not None and not o.get("isDdl") and o.get("data") and prev.get("data")
                    and len(prev["data"]) < most
                    and all(prev.get(k) == o.get(k) for k in ("database", "table", "type", "mysqlType", "sqlType",
                                                              "pkNames"))
                    and prev["_tidb"].get("commitTs") == o["_tidb"].get("commitTs"))
            if same:
                prev["data"] += o["data"]
                if o.get("old") is not None:
                    prev["old"] = (prev.get("old") or []) + o["old"]
            else:
                merged.append(o)
        out.extend(KafkaMessage(TOPIC, part, off, None, orjson.dumps(o)) for off, o in enumerate(merged))
    return out


def test_multi_row_messages_are_taken_and_equal():
    """Several rows per message: each row's position, size and images as the record path gives them."""
    msgs = _merged_rows(_bench_messages(3000, 5))
    assert any(len(orjson.loads(m.value).get("data") or []) > 1 for m in msgs)
    taken, refused = _checkslices(slices(msgs, 50))
    assert taken > 20 and refused == 0


def test_the_driver_decodes_with_the_lane_what_the_record_path_decodes():
    """decode_records (what the driver decodes: a live replica's small batches): the lane's events and rows, per
    partition, are the record path's."""
    from applier.decode import decode_records

    msgs = _with_watermarks(_bench_messages(2000, 9), 17)
    dec = get_decoder("canal-json")
    got = decode_records(dec, msgs, stop_at_error=True, columnar=True)
    want = decode_records(dec, msgs, stop_at_error=True, columnar=False)
    assert got.batches and not want.batches
    assert got.messages == want.messages == len(msgs)
    lane = [e for b in got.batches for e in b.to_events()] + got.events
    key = lambda e: (e.position.partition, e.position.offset)  # noqa: E731 - one message's events keep their order
    assert sorted(lane, key=key) == sorted(want.events, key=key)


def test_window_events_keeps_the_same_change_at_another_commit_ts():
    """A row deleted and inserted back with the same content at a later ts (a unique-key swap as TiCDC splits it)
    is another change, not a copy: only the same commit ts makes a copy (the first version of window_events
    compared identities across the whole window and lost such rows under a quarantine block)."""
    from applier.events import Column, Op, SourcePosition

    cols = (Column("id", "bigint", key=True, unique=True), Column("email", "varchar"))
    row = {"id": 14, "email": "user14"}

    def ev(ts: int, op: Op, off: int) -> RowChange:
        before, after = (dict(row), None) if op is Op.DELETE else (None, dict(row))
        return RowChange("shop", "customers", ts, op, before, after, cols, SourcePosition(TOPIC, 0, off), 10)

    first = [ev(100, Op.INSERT, 1), ev(200, Op.DELETE, 2)]
    again = [ev(300, Op.INSERT, 3), ev(300, Op.INSERT, 4)]  # the second: a copy (same ts, same change)

    class _B:
        def __init__(self, evs):
            self.evs = evs

        def to_events(self):
            return list(self.evs)

    got, dropped = window_events(first, [_B(again)], row_identity)
    assert [(e.commit_ts, e.position.offset) for e in got] == [(100, 1), (200, 2), (300, 3)]
    assert dropped == 1
