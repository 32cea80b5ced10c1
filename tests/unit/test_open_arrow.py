"""The columnar lane's Open Protocol decoder against the per-record path (issue 25).

``OpenDecoder.decode_arrow`` must give, for every slice it takes, exactly the events ``decode`` gives record by
record (sizes as ``decode_messages`` sets them), and take no slice the record path refuses; the gate holding its
row batches must release what the gate holding events releases. The value conversions it adds to
:mod:`applier.columnar.values` (JSON numbers, Go-quoted and base64 bytes, TIME) are checked against the codec's
own converters value by value.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pytest

from applier import mysql_values as T
from applier.clock import clock_limit
from applier.codecs import get_decoder
from applier.codecs import open as O
from applier.decode import decode_messages
from applier.devtools.encoders import open as OE
from applier.events import DDL, DecodeError, KafkaMessage, Resolved, RowChange
from tests.e2e import ticdc_real
from tests.unit.arrow_lane import bench_messages, gate_differential
from tests.unit.arrow_lane import per_partition as _per_partition
from tests.unit.arrow_lane import slices as _slices

LIMIT = clock_limit(None)
TOPIC = "t"


def _bench_messages(events: int = 3000, seed: int = 1) -> list[KafkaMessage]:
    return bench_messages("open", events, seed, TOPIC)


def _record_by_record(msgs: list[KafkaMessage]) -> list:
    return decode_messages(get_decoder("open"), msgs, stop_at_error=True).events


def _has_ddl(msgs: list[KafkaMessage]) -> bool:
    return any(type(e) is DDL for e in _record_by_record(msgs))


def _check_slices(slices: list[list[KafkaMessage]], dec=None) -> tuple[int, list[list[KafkaMessage]]]:
    dec = dec or get_decoder("open")
    taken, refused = 0, []
    for s in slices:
        got = dec.decode_arrow(s, LIMIT)
        if got is None:
            refused.append(s)
            continue
        taken += 1
        assert got.messages == len(s)
        want = _record_by_record(s)
        events = got.to_events()
        assert events == want
        assert [getattr(e, "size", None) for e in events] == [getattr(e, "size", None) for e in want]
    return taken, refused


def test_bench_stream_every_slice_is_taken_and_equal():
    msgs = _bench_messages()
    slices = _slices(msgs, 64) + _slices(msgs, 7) + _slices(msgs, 3)
    taken, refused = _check_slices(slices)
    assert taken == len(slices) > 100 and not refused  # the CREATE TABLE messages are kept as events in place
    assert any(_has_ddl(s) for s in slices)


def test_bench_stream_sizes_and_resolved_events():
    """A record's size is its key and value bytes over all its events, resolved ones included; resolved events
    stay objects, in their place."""
    msgs = [m for m in _bench_messages() if m.partition == 0][8:]
    rows = [m for m in msgs if any(type(e) is RowChange for e in _record_by_record([m]))][:2]
    key_r, value_r = OE.frame_open_batch([(orjson.dumps({"ts": 5, "t": 3}), b"")])
    k1, v1 = rows[0].key, rows[0].value
    # a record holding the rows of the first one and a resolved event in the middle
    pairs = list(zip(_frames(k1, 8), _frames(v1, 0)))
    pairs.insert(1, (orjson.dumps({"ts": 5, "t": 3}), b""))
    key, value = OE.frame_open_batch(pairs)
    s = [KafkaMessage(TOPIC, 0, 1, key_r, value_r), KafkaMessage(TOPIC, 0, 2, key, value), rows[1]]
    got = get_decoder("open").decode_arrow(s, LIMIT)
    assert got is not None
    want = _record_by_record(s)
    assert got.to_events() == want
    n = len(pairs)
    assert {e.size for e in want if type(e) is RowChange and e.position.offset == 2} == {(len(key) + len(value)) // n}
    assert [type(e) for e in got.extras] == [Resolved, Resolved]


@pytest.mark.parametrize("size", [1, 5, 64])
def test_real_ticdc_stream_equal_where_taken(size):
    msgs = ticdc_real.messages("open", TOPIC)
    slices = _slices(msgs, size)
    taken, refused = _check_slices(slices)
    assert taken == len(slices) and not refused  # TiCDC's own stream (every type of t_types included) is taken
    assert taken >= {1: 719, 5: 145, 64: 13}[size]


def test_real_ticdc_stream_takes_every_type():
    msgs = [m for m in ticdc_real.messages("open", TOPIC) if not _has_ddl([m])]
    got = get_decoder("open").decode_arrow(msgs[:200], LIMIT)
    assert got is not None
    kinds = {k for b in got.batches for k in b.shape.kinds}
    assert kinds == {"int", "float", "str", "bytes", "decimal", "date", "datetime", O.TIME_KIND}


def test_ddl_events_are_kept_in_their_place():
    """A DDL event (TiCDC sends one alone; the format allows it among rows) stays an event in its place, its ts
    trusted under the limit, sized as decode_messages sizes it."""
    msgs = [m for m in _bench_messages() if m.partition == 0]
    ddl_msg, row_msg = msgs[0], next(m for m in msgs if all(type(e) is RowChange for e in _record_by_record([m])))
    pairs = list(zip(_frames(row_msg.key, 8), _frames(row_msg.value, 0)))
    pairs.insert(2, (_frames(ddl_msg.key, 8)[0], _frames(ddl_msg.value, 0)[0]))
    key, value = OE.frame_open_batch(pairs)
    s = [ddl_msg, KafkaMessage(TOPIC, 0, 1, key, value), msgs[9]]
    got = get_decoder("open").decode_arrow(s, LIMIT)
    assert got is not None and [type(e) for e in got.extras if type(e) is DDL] == [DDL, DDL]
    want = _record_by_record(s)
    assert got.to_events() == want
    assert [e.size for e in got.to_events()] == [e.size for e in want]
    ddl_ts = _record_by_record([ddl_msg])[0].commit_ts
    assert get_decoder("open").decode_arrow([ddl_msg], ddl_ts) is not None
    assert get_decoder("open").decode_arrow([ddl_msg], ddl_ts - 1) is None


def test_the_driver_decodes_with_the_lane_what_the_record_path_decodes():
    """decode_records (what the driver decodes: a live replica's small batches): the lane's events and rows, per
    partition, are the record path's."""
    from applier.decode import decode_records

    msgs = _bench_messages(2000, 9)
    dec = get_decoder("open")
    got = decode_records(dec, msgs, stop_at_error=True, columnar=True)
    want = decode_records(dec, msgs, stop_at_error=True, columnar=False)
    assert got.batches and not want.batches
    assert got.messages == want.messages == len(msgs)
    lane = [e for b in got.batches for e in b.to_events()] + got.events
    # one message's events keep their order within a table (the lane holds each table's rows in its own batch)
    key = lambda e: (e.position.partition, e.position.offset, getattr(e, "table", ""))  # noqa: E731
    assert sorted(lane, key=key) == sorted(want.events, key=key)


def test_what_the_lane_leaves_to_the_record_path():
    msgs = [m for m in _bench_messages() if m.partition == 0]
    plain = msgs[8:20]
    assert get_decoder("open").decode_arrow(plain, LIMIT) is not None
    assert get_decoder("open", strict_values=False).decode_arrow(plain, LIMIT) is None
    # a compressed stream: the lane does not decompress (the same records, compressed as TiCDC would)
    from applier.devtools.encoders.largemsg import compress

    packed = []
    for m in plain:
        pairs = [(k, v if not v else compress("lz4", v)) for k, v in zip(_frames(m.key, 8), _frames(m.value, 0))]
        packed.append(KafkaMessage(TOPIC, 0, m.offset, *OE.frame_open_batch(pairs)))
    lz4 = get_decoder("open", large_message_handle_compression="lz4")
    assert len(decode_messages(lz4, packed, stop_at_error=True).events) == len(_record_by_record(plain))
    assert lz4.decode_arrow(packed, LIMIT) is None
    empty = KafkaMessage(TOPIC, 0, 99, OE.frame_open_batch([])[0], b"")  # a record without events
    assert _record_by_record([empty]) == []
    assert get_decoder("open").decode_arrow(plain + [empty], LIMIT) is None


# ---- mutated messages ---------------------------------------------------------------------------------------------

def _frames(buf: bytes, start: int) -> list[bytes]:
    return [bytes(buf[o:o + n]) for o, n in O._split_frames(buf, start, "x")]


def _dumps(obj) -> bytes:
    # json, not orjson: it writes integers beyond 64 bits and NaN (which the decoders must refuse)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


_ODD = [" 5", "5", "+7", "٣", "1e999", "nan", "-0", "00012", "0000-00-00 00:00:00", "2024-02-30 00:00:00",
        "2024-02-29 23:59:59.5", "2023-02-29", "24:00:00", "-838:59:59.000000", "2024-01-01 24:00:00", "2024-01-01",
        "9999-12-31", "0001-01-01 00:00:00.000001", "1.10", "-0.00", ".5", "5.", "1e3", "", "abc", "AA==", "AA=",
        "/w==", "w6k=", "\\x", "\\x4", "\\xff\\u00e9", "\\U0001F600", "\\'", "\\0", "\\400", "\\377\\\\u", "a\\",
        "\u00ff\u00fe", "\u0100", "18446744073709551615", "NULL", None, 0, 5, -1, 2 ** 53, 2 ** 53 + 1, 2 ** 63 - 1,
        2 ** 63, 2 ** 64 - 1, 2 ** 64, -2 ** 63, -2 ** 63 - 1, 1.5, 2.0, -0.0, 1e300, 3.0e18, float("nan"), True,
        False, ["x"], {"a": 1}]


def _mutate(rng: random.Random, key: bytes, value: bytes) -> tuple[bytes, bytes]:
    try:
        keys = [orjson.loads(k) for k in _frames(key, 8)]
        values = [orjson.loads(v) if v else None for v in _frames(value, 0)]
    except Exception:  # noqa: BLE001 - mutated before beyond reading
        return key, value
    if not keys:
        return key, value
    i = rng.randrange(len(keys))
    k, v = keys[i], values[i]
    how = rng.randrange(14)
    images = [im for im in (v or {}).values() if isinstance(im, dict) and im]
    if how <= 4 and images:  # a value of another spelling or JSON type
        col = rng.choice(list((im := rng.choice(images)).values()))
        col["v"] = rng.choice(_ODD)
    elif how == 5 and images:  # a column left out
        im = rng.choice(images)
        del im[rng.choice(list(im))]
    elif how == 6 and images:  # the columns in another order
        im = rng.choice(images)
        items = list(im.items())
        rng.shuffle(items)
        im.clear()
        im.update(items)
    elif how == 7 and images:  # a column's type code, flags or handle flag
        col = rng.choice(list(rng.choice(images).values()))
        field = rng.choice(["t", "f", "h", "v"])
        if rng.random() < 0.2:
            col.pop(field, None)
        else:
            col[field] = rng.choice([0, 1, 3, 8, 11, 12, 15, 65, 128, 246, 252, 254, 300, 1.0, 8.0, True, False, None,
                                     "8", -1])
    elif how == 8:  # the key's ts, type, schema, table, flags
        field = rng.choice(["ts", "t", "scm", "tbl", "ohk", "ccl"])
        k[field] = rng.choice([-1, 0, 2 ** 63, 2 ** 64, "1", 1.0, None, True, 1, 2, 3, 4, "", "x", "s3://x"])
    elif how == 9 and v is not None:  # the images themselves
        field = rng.choice(["u", "p", "d"])
        v[field] = rng.choice([None, [], {}, "x", 1, [None], v.get("u"), v.get("d")])
    elif how == 10 and v is not None and "p" in v and isinstance(v["p"], dict):  # only-updated-columns p
        names = list(v["p"])
        for n in rng.sample(names, rng.randrange(1, len(names))):
            del v["p"][n]
    elif how == 11:  # an event removed or repeated (the key and value frames disagree, or not)
        j = rng.randrange(len(keys))
        if rng.random() < 0.5:
            del keys[j]
        else:
            keys.insert(j, keys[j])
            values.insert(j, values[j])
    elif how == 12:  # a resolved event in the record
        keys.insert(i, {"ts": rng.choice([0, k.get("ts", 0), 2 ** 63]), "t": 3})
        values.insert(i, None)
    else:  # a truncated frame
        kb, vb = OE.frame_open_batch((_dumps(a), None if b is None else _dumps(b)) for a, b in zip(keys, values))
        return (kb[:-rng.randrange(1, 5)], vb) if rng.random() < 0.5 else (kb, vb[:-rng.randrange(1, 5)])
    return OE.frame_open_batch((_dumps(a), None if b is None else _dumps(b)) for a, b in zip(keys, values))


def _mutation_trials(msgs: list[KafkaMessage], seed: int, trials: int) -> int:
    rng = random.Random(seed)
    dec = get_decoder("open")
    taken = 0
    for trial in range(trials):
        at = rng.randrange(0, len(msgs) - 6)
        s = list(msgs[at:at + 6])
        i = rng.randrange(len(s))
        m = s[i]
        key, value = m.key, m.value
        for _ in range(rng.choice([1, 1, 2])):
            key, value = _mutate(rng, key, value)
        s[i] = KafkaMessage(m.topic, m.partition, m.offset, key, value)
        got = dec.decode_arrow(s, LIMIT)
        try:
            want = _record_by_record(s)
        except DecodeError:
            assert got is None, f"trial {trial}: the lane took a slice the decoder refuses"
            continue
        if got is not None:
            taken += 1
            events = got.to_events()
            assert events == want, f"trial {trial}"
            assert [getattr(e, "size", None) for e in events] == [getattr(e, "size", None) for e in want]
            assert [type(x) for e in events if type(e) is RowChange for x in e.after or e.before] == \
                   [type(x) for e in want if type(e) is RowChange for x in e.after or e.before]
    return taken


def test_mutated_bench_messages_are_refused_or_equal():
    msgs = [m for m in _bench_messages(1500) if m.partition == 0][8:]
    assert _mutation_trials(msgs, 7, 500) > 100


def test_mutated_real_messages_are_refused_or_equal():
    msgs = [m for m in ticdc_real.messages("open", TOPIC) if not _has_ddl([m])]
    assert _mutation_trials(msgs, 11, 500) > 100


def _one_event_message(k: dict, v: dict | None, offset: int = 0) -> KafkaMessage:
    key, value = OE.frame_open_batch([(_dumps(k), None if v is None else _dumps(v))])
    return KafkaMessage(TOPIC, 0, offset, key, value)


def _bench_events() -> list[tuple[dict, dict]]:
    """(key event, value) of every row event of the bench stream's partition 0."""
    out = []
    for m in [m for m in _bench_messages() if m.partition == 0][8:]:
        for k, v in zip(_frames(m.key, 8), _frames(m.value, 0)):
            if v:
                out.append((orjson.loads(k), orjson.loads(v)))
    return out


def _refused_or_equal(s: list[KafkaMessage]) -> str:
    got = get_decoder("open").decode_arrow(s, LIMIT)
    try:
        want = _record_by_record(s)
    except DecodeError:
        assert got is None, "the lane took a slice the decoder refuses"
        return "refused by both"
    if got is None:
        return "refused"
    assert got.to_events() == want
    return "taken"


def test_update_images_refused_or_equal():
    """'p' as TiCDC's options and odd encoders write it: the lane takes the default (every column, in u's order)."""
    k, v = next((k, v) for k, v in _bench_events() if "p" in v)
    ints = [n for n, c in v["p"].items() if type(c["v"]) is int]
    cases = {}
    cases["default"] = v
    items = list(v["p"].items())
    i, j = list(v["p"]).index(ints[0]), list(v["p"]).index(ints[-1])
    items[i], items[j] = items[j], items[i]  # two integer columns in each other's place
    cases["reordered"] = {"u": v["u"], "p": dict(items)}
    cases["only updated"] = {"u": v["u"], "p": {n: c for n, c in v["p"].items() if n in ("ver", "note")}}
    cases["extra column"] = {"u": v["u"], "p": {**v["p"], "zz": {"t": 3, "f": 0, "v": 1}}}
    cases["empty"] = {"u": v["u"], "p": {}}
    cases["other flags"] = {"u": v["u"], "p": {n: {**c, "f": c["f"] | 64} for n, c in v["p"].items()}}
    got = {name: _refused_or_equal([_one_event_message(k, val)]) for name, val in cases.items()}
    assert got["default"] == "taken" and got["other flags"] == "taken"
    assert got["empty"] == "refused by both"


def test_large_message_flags():
    events = _bench_events()
    k, v = next((k, v) for k, v in events if "p" in v)
    kd, vd = next((k, v) for k, v in events if "d" in v)
    # a handle-key-only insert/update needs the upstream: the record path refuses it, the lane must too
    assert _refused_or_equal([_one_event_message({**k, "ohk": True}, v)]) == "refused by both"
    # a handle-key-only delete decodes as it is
    only_key = {"d": {n: c for n, c in vd["d"].items() if c.get("h")}}
    assert _refused_or_equal([_one_event_message({**kd, "ohk": True}, only_key)]) == "taken"
    assert _refused_or_equal([_one_event_message({**k, "ohk": False}, v)]) == "taken"
    # a claim-check row: read from the claim-check storage, which the lane does not do
    got = get_decoder("open").decode_arrow([_one_event_message({**k, "ohk": False, "ccl": "s3://b/x"}, v)], LIMIT)
    assert got is None
    assert _refused_or_equal([_one_event_message({**k, "ccl": ""}, v)]) == "taken"


def test_values_of_one_type_compare_by_type():
    """Equal values of another Python type must not pass (an int column's 1 and 1.0, True): the events compare
    equal while the writers would bind another type."""
    msgs = [m for m in _bench_messages() if m.partition == 0][8:]
    msgs = [m for m in msgs if all(type(e) is RowChange for e in _record_by_record([m]))][:6]
    keys = [orjson.loads(k) for k in _frames(msgs[0].key, 8)]
    values = [orjson.loads(v) for v in _frames(msgs[0].value, 0)]
    for odd in (2.0, True):
        vs = json.loads(json.dumps(values))
        vs[0]["u"]["flag"]["v"] = odd  # a TINYINT
        key, value = OE.frame_open_batch((_dumps(a), _dumps(b)) for a, b in zip(keys, vs))
        s = [KafkaMessage(TOPIC, 0, 0, key, value)] + msgs[1:]
        got = get_decoder("open").decode_arrow(s, LIMIT)
        try:
            want = _record_by_record(s)
        except DecodeError:
            assert got is None
            continue
        assert got is not None
        flag = [e.after["flag"] for e in got.to_events() if type(e) is RowChange][0]
        assert type(flag) is type([e.after["flag"] for e in want if type(e) is RowChange][0]) is int


def test_untrusted_ts_is_left_to_the_record_path():
    msgs = [m for m in _bench_messages(600) if m.partition == 0][9:40]
    dec = get_decoder("open")
    got = dec.decode_arrow(msgs, LIMIT)
    assert got is not None and got.extras  # rows and resolved events
    ts = [e.commit_ts if type(e) is RowChange else e.ts for e in got.to_events()]
    assert dec.decode_arrow(msgs, max(ts)) is not None
    assert dec.decode_arrow(msgs, max(ts) - 1) is None
    resolved_only = [m for m in msgs if all(type(e) is Resolved for e in _record_by_record([m]))]
    top = max(e.ts for e in got.extras)
    assert dec.decode_arrow(resolved_only, top) is not None and dec.decode_arrow(resolved_only, top - 1) is None


# ---- the added value conversions ------------------------------------------------------------------------------------

def test_re2_pattern_is_the_python_pattern():
    rng = random.Random(3)
    alphabet = ["\\", "x", "a", "0", "3", "4", "7", "8", "f", "F", "g", "u", "U", "n", "t", "v", "'", '"', "\n", "\0",
                "é", "\U0001F600"]
    texts = ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 10))) for _ in range(50_000)]
    got = pc.match_substring_regex(pa.array(texts), O._GO_BYTE_ESCAPES_RE2).to_pylist()
    want = [O._GO_BYTE_ESCAPES.fullmatch(t) is not None for t in texts]
    assert got == want and 0 < sum(got) < len(texts)


def _outcome(f, *args):
    try:
        return "ok", f(*args)
    except Exception:  # noqa: BLE001
        return "raises", None


@pytest.mark.parametrize("seed", range(4))
def test_go_unquote_all_is_go_unquote(seed):
    rng = random.Random(seed)
    texts = [OE.go_quote(bytes(rng.randrange(256) for _ in range(rng.randrange(0, 12)))) for _ in range(3000)]
    texts += [OE.go_quote(rng.choice(["é", "\u0085", "\u2028", "\U0001F600", "a\tb"]).encode()) for _ in range(50)]
    texts += ["\\u00e9", "\\\\u", "\\U0010FFFF", "", "\\377", "\\\\x41"]
    rng.shuffle(texts)
    assert O._go_unquote_all(texts) == [O.go_unquote(t) for t in texts]
    for bad in ("\\q", "\\'", "\\0", "\\400", "\\x4", "a\\", "\\ud800"):
        assert _outcome(O.go_unquote, bad)[0] == "raises"
        assert _outcome(O._go_unquote_all, texts[:50] + [bad])[0] == "raises"


_PY_VALUES = {
    O._conv_int: [0, 1, -1, 2 ** 63 - 1, -2 ** 63, 2.0, -(2.0 ** 52), None],
    O._conv_float: [0.0, -0.0, 1.5, 1e300, 5e-324, 1, -7, 2 ** 60, None],
    O._conv_str: ["", "a", "é", "\U0001F600", "\0", None],
    O._conv_go_quoted: ["", "a", "\\x00\\xff", "\\u00e9", "é", None],
    O._conv_b64_bytes: ["", "AA==", "/w==", "w6k=", None],
    O._conv_b64_text: ["", "YQ==", "w6k=", "8J+YgA==", None],
    T.parse_time: ["00:00:00", "-838:59:59.000000", "838:59:59", "12:34:56.5", "-00:00:00.000001", "100000:00:00",
                   None],
}


@pytest.mark.parametrize("conv", list(_PY_VALUES), ids=lambda c: c.__name__)
def test_py_array_gives_what_the_converter_gives(conv):
    rng = random.Random(1)
    for _ in range(60):
        values = [rng.choice(_PY_VALUES[conv]) for _ in range(rng.randrange(0, 12))]
        arr = O._py_array(conv, values)
        got = arr.to_pylist()
        want = [None if v is None else conv(v) for v in values]
        assert [(type(g), g) for g in got] == [(type(w), w) for w in want]
        assert [str(g) for g in got] == [str(w) for w in want]  # -0.0 stays -0.0


@pytest.mark.parametrize("conv, value", [
    (O._conv_int, 2 ** 64), (O._conv_int, 2.5), (O._conv_int, True), (O._conv_int, "5"), (O._conv_int, 2.0 ** 60),
    (O._conv_float, "1.5"), (O._conv_float, True), (O._conv_float, 10 ** 400), (O._conv_str, 5),
    (O._conv_go_quoted, "\\q"), (O._conv_b64_bytes, "AA="), (O._conv_b64_text, "/w=="), (T.parse_time, "12:60:00"),
    (T.parse_time, "99999999999:00:00"), (T.parse_time, "3000000000:00:00"),
])
def test_py_array_refuses_what_the_converter_refuses_or_arrow_cannot_hold(conv, value):
    """(3000000000 hours is a timedelta beyond int64 microseconds: the converter takes it, Arrow cannot hold it)"""
    with pytest.raises(Exception):
        O._py_array(conv, [None, value])


def test_int_columns_beyond_int64_are_uint64_alone():
    cols = O._ArrowColumns()
    a = cols.add(O._conv_int, [1, 2 ** 64 - 1, None])
    b = cols.add(O._conv_int, [-1, 5])
    got = cols.convert()
    assert got[a].type == pa.uint64() and got[a].to_pylist() == [1, 2 ** 64 - 1, None]
    assert got[b].type == pa.int64() and got[b].to_pylist() == [-1, 5]
    cols = O._ArrowColumns()
    cols.add(O._conv_int, [-1, 2 ** 64 - 1])
    with pytest.raises(Exception):
        cols.convert()


def test_time_round_trips_through_duration():
    values = ["-838:59:59.999999", "838:59:59.999999", "00:00:00", "-00:00:00.5", "24:00:00"]
    got = O._py_array(T.parse_time, values).to_pylist()
    assert got == [T.parse_time(v) for v in values] and all(type(g) is dt.timedelta for g in got)


def test_decimal_text_keeps_its_scale():
    msgs = ticdc_real.messages("open", TOPIC)
    got = get_decoder("open").decode_arrow([m for m in msgs if not _has_ddl([m])][:100], LIMIT)
    decs = [v for e in got.to_events() if type(e) is RowChange for v in (e.after or e.before).values()
            if type(v) is Decimal]
    assert decs and any(d.as_tuple().exponent < 0 for d in decs)


# ---- the gate with row batches ----------------------------------------------------------------------------------

def _with_resolved(msgs: list[KafkaMessage], every: int) -> list[KafkaMessage]:
    """``msgs`` with a resolved event after every ``every`` records of each partition, each as high as the stream
    allows there (one below the lowest commit ts of a row still to come in that partition), offsets renumbered:
    so that releases cut through held row batches."""
    out = []
    for part, ms in _per_partition(msgs).items():
        lows = []
        low = None
        for m in reversed(ms):
            lows.append(low)
            ts = [e.commit_ts for e in _record_by_record([m]) if type(e) is RowChange]
            if ts:
                low = min(ts) if low is None else min(low, *ts)
        lows.reverse()
        off = 0
        for i, m in enumerate(ms):
            out.append(KafkaMessage(m.topic, part, off, m.key, m.value))
            off += 1
            if (i + 1) % every == 0 and lows[i] is not None:
                key, value = OE.frame_open_batch([(orjson.dumps({"ts": lows[i] - 1, "t": 3}), b"")])
                out.append(KafkaMessage(m.topic, part, off, key, value))
                off += 1
    return out


def _table_by_table(events: list) -> list:
    """``events`` with the rows of one record (one commit ts and position) ordered table by table, each table's in
    record order. An Open Protocol record batches rows of several tables; the lane holds each table's rows in its
    own batch and merges batches by commit ts and position (:data:`applier.columnar.apply._COMMIT_ORDER`), so the
    rows of one record come back table by table. Tables are independent inside a window, so that order is all
    the writers can see (within a table the order is the record's)."""
    def key(e):
        pos = e.position
        return (getattr(e, "commit_ts", getattr(e, "ts", 0)), pos.topic, pos.partition, pos.offset,
                getattr(e, "schema", ""), getattr(e, "table", ""))
    return sorted(events, key=key)


@pytest.mark.parametrize("seed, budget", [(1, 512 * 1024 * 1024), (2, 64 * 1024), (3, 1)])
def test_gate_with_batches_releases_what_the_event_gate_releases(seed, budget, tmp_path):
    def same(got: list, want: list) -> None:
        assert _table_by_table(got) == _table_by_table(want)
        assert [e for e in got if type(e) is not RowChange] == [e for e in want if type(e) is not RowChange]

    gate_differential("open", _with_resolved(_bench_messages(4000, seed), 5), random.Random(seed), budget, tmp_path,
                      most=60, slice_size=13, same=same)
