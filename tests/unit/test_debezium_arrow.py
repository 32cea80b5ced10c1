"""The columnar lane's Debezium decoder against the per-record path (issue 25).

``DebeziumDecoder.decode_arrow`` must give, for every slice it takes, exactly the events ``decode`` gives record by
record (values and their Python types, Column tuples, sizes, positions, commit ts), and take no slice the record
path refuses; the gate holding its row batches must release what the gate holding events releases. It reads records
with msgspec (the schema envelope as raw bytes) where the record path uses orjson: the two parsers are compared here
where the lane relies on them agreeing. The column conversions (:mod:`applier.columnar.json_values`) are checked
against the codec's own converters value by value.
"""

from __future__ import annotations

import datetime as dt
import json
import random
from decimal import Decimal

import msgspec
import orjson
import pyarrow as pa
import pytest

from applier.clock import clock_limit
from applier.codecs import debezium as D
from applier.codecs import get_decoder
from applier.columnar import json_values as J
from applier.columnar import values as V
from applier.decode import decode_messages
from applier.events import DDL, DecodeError, KafkaMessage, Resolved, RowChange
from tests.e2e import ticdc_real
from tests.unit.arrow_lane import bench_messages, gate_differential, per_partition, slices

LIMIT = clock_limit(None)
TOPIC = "t"
GATED = {"gated": True, "require_tidb_extension": True}  # the bench's and the real streams' changefeed options


def _decoder(**options):
    return get_decoder("debezium", **{**GATED, **options})


def _bench_messages(events: int = 3000, seed: int = 1) -> list[KafkaMessage]:
    return bench_messages("debezium", events, seed, TOPIC, tidb_extension=True)


def _record_by_record(msgs: list[KafkaMessage], **options) -> list:
    return decode_messages(_decoder(**options), msgs, stop_at_error=True).events


def _exact(events: list) -> list:
    """What equality of events leaves out: each image value's Python type and repr (Decimal('1E+1') == 10, 1 ==
    1.0 == True), sizes, Column tuples compared field by field."""
    out = []
    for e in events:
        if type(e) is RowChange:
            images = [None if im is None else [(k, type(v), repr(v)) for k, v in im.items()] for im in
                      (e.before, e.after)]
            out.append((e.size, e.columns, images))
        else:
            out.append((getattr(e, "size", None), e))
    return out


def _check(s: list[KafkaMessage], dec=None, **options) -> str:
    """'taken' (and equal), 'refused', or 'refused by both' (the record path raises); ``options``: the decoders'
    beyond GATED."""
    dec = dec or _decoder(**options)
    got = dec.decode_arrow(s, LIMIT)
    try:
        want = _record_by_record(s, **options)
    except DecodeError:
        assert got is None, "the lane took a slice the record path refuses"
        return "refused by both"
    if got is None:
        return "refused"
    assert got.messages == len(s)
    events = got.to_events()
    assert events == want
    assert _exact(events) == _exact(want)
    return "taken"


def _has(msgs: list[KafkaMessage], typ: type) -> bool:
    return any(type(e) is typ for e in _record_by_record(msgs))


def test_bench_stream_every_slice_is_taken_and_equal():
    msgs = _bench_messages()
    dec = _decoder()
    cut = slices(msgs, 64) + slices(msgs, 7) + slices(msgs, 3)
    got = [_check(s, dec) for s in cut]
    assert got.count("taken") == len(cut) > 100
    assert any(_has(s, DDL) for s in cut) and any(_has(s, Resolved) for s in cut)


@pytest.mark.parametrize("variant", ["debezium", "debezium-no-bit"])
@pytest.mark.parametrize("size", [1, 5, 64])
def test_real_ticdc_stream_equal_where_taken(variant, size):
    """TiCDC's own encoder (every type of t_types, DECIMAL boundaries 1e+28 and -1e-10 included): every slice
    taken (1237 of 1237 records)."""
    assert ticdc_real.VARIANTS[variant] == ("debezium", GATED)
    msgs = ticdc_real.messages(variant, TOPIC)
    dec = _decoder()
    cut = slices(msgs, size)
    got = [_check(s, dec) for s in cut]
    assert got.count("taken") == len(cut)
    assert sum(len(s) for s in cut) == len(msgs) > 1000


def test_real_ticdc_stream_takes_every_type():
    msgs = [m for m in ticdc_real.messages("debezium", TOPIC) if not _has([m], DDL)]
    got = _decoder().decode_arrow(msgs[:300], LIMIT)
    assert got is not None
    kinds = {k for b in got.batches for k in b.shape.kinds}
    assert kinds == {V.INT, V.FLOAT, V.STR, V.BYTES, V.DECIMAL, V.DATE, V.DATETIME, J.TIME}
    values = [v for e in got.to_events() if type(e) is RowChange for v in (e.after or e.before).values()]
    assert {Decimal("1E+28"), Decimal("-1E-10")} <= set(values)
    assert any(type(v) is dt.timedelta for v in values) and any(type(v) is bytes for v in values)


def test_ddl_and_watermarks_are_kept_in_their_place():
    msgs = [m for m in _bench_messages() if m.partition == 0]
    ddl = next(i for i, m in enumerate(msgs) if _has([m], DDL))
    wm = next(i for i, m in enumerate(msgs) if _has([m], Resolved))
    s = msgs[max(0, ddl - 3):ddl + 4] + msgs[wm - 3:wm + 4]
    got = _decoder().decode_arrow(s, LIMIT)
    assert got is not None
    want = _record_by_record(s)
    assert got.extras == [e for e in want if type(e) is not RowChange]
    assert {type(e) for e in got.extras} == {DDL, Resolved} and got.batches
    assert got.to_events() == want and _exact(got.to_events()) == _exact(want)
    assert [i for i, e in enumerate(want) if type(e) is not RowChange] == [i for i, o in enumerate(got.order) if o < 0]
    ddl_ts = _record_by_record([msgs[ddl]])[0].commit_ts
    wm_ts = _record_by_record([msgs[wm]])[0].ts
    assert _decoder().decode_arrow([msgs[ddl]], ddl_ts) is not None
    assert _decoder().decode_arrow([msgs[ddl]], ddl_ts - 1) is None
    assert _decoder().decode_arrow([msgs[wm]], wm_ts) is not None
    assert _decoder().decode_arrow([msgs[wm]], wm_ts - 1) is None


def test_untrusted_ts_is_left_to_the_record_path():
    msgs = [m for m in _bench_messages(600) if m.partition == 0][9:40]
    dec = _decoder()
    got = dec.decode_arrow(msgs, LIMIT)
    assert got is not None and got.batches
    ts = [e.commit_ts for e in got.to_events() if type(e) is RowChange]
    assert dec.decode_arrow(msgs, max(ts)) is not None
    assert dec.decode_arrow(msgs, max(ts) - 1) is None


def _row_value(msgs: list[KafkaMessage], op: str) -> tuple[KafkaMessage, dict]:
    m = next(m for m in msgs if m.value and orjson.loads(m.value)["payload"].get("op") == op)
    return m, orjson.loads(m.value)


def _with(m: KafkaMessage, value: dict | bytes, key: bytes | None | str = "same") -> KafkaMessage:
    raw = value if isinstance(value, bytes) else json.dumps(value, ensure_ascii=False,
                                                            separators=(",", ":")).encode()
    return KafkaMessage(m.topic, m.partition, m.offset, m.key if key == "same" else key, raw)


def test_what_the_lane_leaves_to_the_record_path():
    msgs = [m for m in _bench_messages() if m.partition == 0][8:]
    plain = [m for m in msgs if _has([m], RowChange)][:10]
    assert _decoder().decode_arrow(plain, LIMIT) is not None
    # an ungated decoder: no commit ts to batch by (as Canal-JSON without its extension)
    assert get_decoder("debezium").decode_arrow(plain, LIMIT) is None
    m, u = _row_value(msgs, "u")
    cases = {}
    cases["tombstone"] = KafkaMessage(m.topic, m.partition, m.offset, m.key, b"")
    cases["no schema"] = _with(m, {"payload": u["payload"]})
    cases["bare payload"] = _with(m, u["payload"])
    cases["update without before"] = _with(m, {**u, "payload": {k: v for k, v in u["payload"].items()
                                                                   if k != "before"}})
    after = u["payload"]["after"]
    cases["columns reordered"] = _with(m, {**u, "payload": {**u["payload"], "after": dict(reversed(after.items()))}})
    cases["a column left out"] = _with(m, {**u, "payload": {**u["payload"], "after": dict(list(after.items())[1:])}})
    cases["no commit ts"] = _with(m, {**u, "payload": {**u["payload"], "source": {
        k: v for k, v in u["payload"]["source"].items() if k != "commit_ts"}}})
    swapped = dict(after)
    swapped["id"], swapped["ver"] = after["ver"], after["id"]  # two BIGINT columns in each other's place
    cases["two columns swapped"] = _with(m, {**u, "payload": {**u["payload"], "after": {
        ("ver" if k == "id" else "id" if k == "ver" else k): v for k, v in swapped.items()}}})
    for odd in (1.0, True, "1", -1, 2 ** 64, None):
        cases[f"commit ts {odd!r}"] = _with(m, {**u, "payload": {**u["payload"], "source": {
            **u["payload"]["source"], "commit_ts": odd}}})
    connect = json.loads(json.dumps(u))
    for f in connect["schema"]["fields"][:2]:  # 'amount' as a Connect Decimal (real Debezium's precise mode)
        amount = next(x for x in f["fields"] if x["field"] == "amount")
        amount.update(type="bytes", name="org.apache.kafka.connect.data.Decimal", parameters={"scale": "2"})
    connect["payload"]["before"]["amount"] = connect["payload"]["after"]["amount"] = "AQ=="
    cases["connect decimal"] = _with(m, connect)
    # (the same record unchanged first: the changed one's schema bytes are then known, and it is read on the lane)
    assert _check([_with(m, u)]) == "taken"
    got = {name: _check([plain[0], _with(m, u), c, plain[1]]) for name, c in cases.items()}
    assert got == {"tombstone": "refused", "no schema": "refused by both", "bare payload": "refused by both",
                   "update without before": "refused", "columns reordered": "refused",
                   "a column left out": "refused", "no commit ts": "refused by both", "connect decimal": "refused",
                   "two columns swapped": "refused", **{f"commit ts {odd!r}": "refused by both" for odd in
                                                        (1.0, True, "1", -1, 2 ** 64, None)}}
    assert _check([plain[0], cases["no schema"]], require_tidb_extension=False) == "refused"
    for op, image in (("c", "after"), ("d", "before")):  # an insert's and a delete's image, two columns swapped
        m, v = _row_value(msgs, op)
        im = v["payload"][image]
        swapped = json.loads(json.dumps(v))
        swapped["payload"][image] = {("ver" if k == "id" else "id" if k == "ver" else k): im[
            "ver" if k == "id" else "id" if k == "ver" else k] for k in im}
        assert list(swapped["payload"][image])[0] == "ver"
        assert _check([_with(m, v), _with(m, swapped)]) == "refused"


def test_values_of_one_type_compare_by_type():
    """Equal values of another Python type must not pass (an int column's 2.0 or True; a float column's 2): the
    events compare equal while the writers would bind another type."""
    msgs = [m for m in _bench_messages() if m.partition == 0][8:]
    m, c = _row_value(msgs, "c")
    seen = set()
    for col, odd in (("flag", 2.0), ("flag", True), ("ratio", 2), ("ratio", True), ("amount", 7), ("amount", False),
                     ("day", 3.0), ("created", 1.0), ("name", 5), ("ver", 2 ** 63), ("grp", -1)):
        v = json.loads(json.dumps(c))
        v["payload"]["after"][col] = odd
        mm = _with(m, v)
        seen.add(_check([mm]))
        try:
            want = _record_by_record([mm])
        except DecodeError:
            continue
        got = _decoder().decode_arrow([mm], LIMIT)
        if got is not None:
            assert type(got.to_events()[0].after[col]) is type(want[0].after[col])
    assert seen == {"taken", "refused by both"}


# ---- mutated messages ---------------------------------------------------------------------------------------------

_ODD = [None, 0, 1, -1, 2 ** 31, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, -2 ** 63, -2 ** 63 - 1,
        10 ** 30, -10 ** 30, 1.5, 2.0, -0.0, 1e300, 1e-7, 1e22, 3.0e18, 0.1, True, False, "", "5", "abc", "AA==",
        "/w==", "AA=", "2024-01-01T00:00:00Z", "\u00e9", "\U0001F600", [1], {"a": 1}, 2932896, 2932897, -719162, -719163,
        253402300799999999, 253402300800000000, -62135596800000000, -62135596800000001]
_RAW_ODD = [b"1e999", b"NaN", b"-Infinity", b"18446744073709551616", b"-9223372036854775809",
            b"123456789012345678901234567890", b'"\\ud800"', b'"\xff"', b'"\xed\xa0\x80"', b"1.0", b"1e3", b"-0",
            b"01", b'"\\u0000"', b'"a\x01"', b"tru", b"[]", b"{}"]


def _dumps(obj) -> bytes:
    # json, not orjson: it writes integers beyond 64 bits and NaN (which the decoders must refuse)
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()


def _edit_byte(rng: random.Random, b: bytearray, inserted: bytes) -> None:
    """One byte of ``b`` changed, one of ``inserted`` put in, or one removed, at a random place."""
    i = rng.randrange(len(b))
    r = rng.random()
    if r < 0.4:
        b[i] = rng.randrange(256)
    elif r < 0.7:
        b.insert(i, rng.choice(inserted))
    else:
        del b[i]


def _mutate(rng: random.Random, m: KafkaMessage) -> KafkaMessage:
    key, value = m.key, m.value
    try:
        obj = orjson.loads(value)
        kobj = orjson.loads(key) if key else None
    except Exception:  # noqa: BLE001 - mutated before beyond reading
        obj = kobj = None
    how = rng.randrange(16)
    payload = obj.get("payload") if isinstance(obj, dict) else None
    images = [im for im in (payload.get("before"), payload.get("after")) if isinstance(im, dict) and im] \
        if isinstance(payload, dict) else []
    if how <= 4 and images:  # a value of another spelling or JSON type
        im = rng.choice(images)
        im[rng.choice(list(im))] = rng.choice(_ODD)
    elif how == 5 and images:  # a raw JSON token where a value was (what json.dumps cannot write)
        im = rng.choice(images)
        name = rng.choice(list(im))
        im[name] = "@@RAW@@"
        return _with(m, _dumps(obj).replace(b'"@@RAW@@"', rng.choice(_RAW_ODD)))
    elif how == 6 and images:  # a column left out, or the columns in another order
        im = rng.choice(images)
        items = list(im.items())
        if rng.random() < 0.5:
            del items[rng.randrange(len(items))]
        else:
            rng.shuffle(items)
        im.clear()
        im.update(items)
    elif how == 7 and isinstance(payload, dict):  # the op, images or source
        field = rng.choice(["op", "before", "after", "source"])
        payload[field] = rng.choice([None, "c", "r", "u", "d", "m", "x", 1, {}, [], payload.get("before"),
                                     payload.get("after")])
    elif how == 8 and isinstance(payload, dict) and isinstance(payload.get("source"), dict):
        src = payload["source"]
        field = rng.choice(["commit_ts", "db", "table"])
        src[field] = rng.choice([-1, 0, 2 ** 63, 2 ** 64, 2 ** 64 - 1, "1", 1.0, None, True, "", "x", 5])
    elif how == 9 and isinstance(obj, dict) and isinstance(obj.get("schema"), dict):  # a field schema changed
        structs = [f for f in obj["schema"].get("fields", []) if isinstance(f, dict) and f.get("type") == "struct"
                   and f.get("field") in ("before", "after")]
        if structs:
            f = rng.choice(rng.choice(structs)["fields"])
            attr = rng.choice(["type", "tidb_type", "name", "optional", "field"])
            f[attr] = rng.choice(["int64", "int32", "string", "double", "boolean", "bytes", "bigint unsigned",
                                  "decimal", "binary", "io.debezium.time.MicroTime", "io.debezium.time.Timestamp",
                                  "io.debezium.time.ZonedTimestamp", "io.debezium.data.Bits", None, True, 1])
    elif how == 10 and isinstance(kobj, dict):  # the key's columns
        kp = kobj.get("payload")
        if isinstance(kp, dict):
            kp[rng.choice(["id", "zz", "name"])] = 1
            if rng.random() < 0.3:
                kp.clear()
        key = _dumps(kobj)
    elif how == 11 and isinstance(obj, dict):  # the envelope: members added or removed
        if rng.random() < 0.5:
            obj[rng.choice(["extra", "payload", "schema"])] = rng.choice([None, 1, {}])
        else:
            obj.pop(rng.choice(["payload", "schema"]), None)
    elif how == 12:  # a duplicate member (both parsers keep the last)
        value = value.replace(b'"after":{', b'"after":{"id":1.5,', 1) if rng.random() < 0.5 else \
            value[:-1] + b',"payload":' + _dumps(payload) + b"}"
    else:  # a byte changed, inserted or removed (in the schema envelope as often as not)
        b = bytearray(value)
        _edit_byte(rng, b, b' ,:{}[]"\\0e.-\xff\xc3')
        return _with(m, bytes(b), key)
    return _with(m, _dumps(obj) if obj is not None else value, key)


def _mutation_trials(msgs: list[KafkaMessage], seed: int, trials: int) -> dict[str, int]:
    rng = random.Random(seed)
    dec = _decoder()  # one decoder for all trials: its kept shapes must not let a mutated record through
    out = {"taken": 0, "refused": 0, "refused by both": 0}
    for _ in range(trials):
        at = rng.randrange(0, len(msgs) - 6)
        s = list(msgs[at:at + 6])
        i = rng.randrange(len(s))
        for _ in range(rng.choice([1, 1, 2])):
            s[i] = _mutate(rng, s[i])
        out[_check(s, dec)] += 1
    return out


def test_mutated_bench_messages_are_refused_or_equal():
    msgs = [m for m in _bench_messages(1500) if m.partition == 0][8:]
    got = _mutation_trials(msgs, 7, 600)
    assert got["taken"] > 120 and got["refused by both"] > 150


def test_mutated_real_messages_are_refused_or_equal():
    msgs = [m for m in ticdc_real.messages("debezium", TOPIC) if not _has([m], DDL)]
    got = _mutation_trials(msgs, 11, 400)
    assert got["taken"] > 80 and got["refused by both"] > 100


# ---- msgspec and orjson ---------------------------------------------------------------------------------------------

_DOCS = [b'{"a":1,"a":2}', b'{"a":1,"b":2,"a":3}', b'"\xff"', b'"\\ud800"', b'"\\udc00\\ud800"', b'"\\ud83d\\ude00"',
         b"1 x", b"1.0", b"1e3", b"1E3", b"-0", b"-0.0", b"18446744073709551615", b"-9223372036854775808", b"1e999",
         b"1e-400", b"NaN", b"Infinity", b'"\x00"', b'"\x1f"', b'"\x7f"', b"\xef\xbb\xbf1", b" 1 ", b"[1,]", b"01",
         b"1.", b".5", b'"\xed\xa0\x80"', b'"\xf4\x90\x80\x80"', b'"\xc0\xaf"', b'"\\u0000"', b'"\\a"', b"true1",
         b"0.1", b"2.2250738585072011e-308", b"4.9e-324", b"1.7976931348623157e308", b"9007199254740993.0"]


def _outcome(f, doc: bytes):
    try:
        v = f(doc)
    except Exception:  # noqa: BLE001
        return "raises"
    return json.dumps(v, default=repr), repr(v), type(v)


def _agree(doc: bytes) -> None:
    """msgspec (the lane's untyped reading of a payload) gives what orjson gives, or raises where orjson raises;
    integers beyond 64 bits are the known difference (orjson: float, msgspec: int), which every column conversion
    refuses."""
    got = _outcome(msgspec.json.decode, doc)
    want = _outcome(orjson.loads, doc)
    if got != want:
        assert want != "raises" and got != "raises", doc
        ints = [v for v in _walk(msgspec.json.decode(doc)) if type(v) is int]
        assert ints and not all(-2 ** 63 <= v < 2 ** 64 for v in ints), doc


def _walk(v):
    if isinstance(v, dict):
        for x in v.values():
            yield from _walk(x)
    elif isinstance(v, list):
        for x in v:
            yield from _walk(x)
    else:
        yield v


@pytest.mark.parametrize("doc", _DOCS)
def test_msgspec_reads_json_as_orjson_does(doc):
    _agree(doc)
    _agree(b'{"x":[' + doc + b"]}")


def test_msgspec_reads_mutated_payloads_as_orjson_does():
    rng = random.Random(5)
    values = [orjson.loads(m.value)["payload"] for m in ticdc_real.messages("debezium", TOPIC)[:200] if m.value]
    for _ in range(3000):
        b = bytearray(orjson.dumps(rng.choice(values)))
        for _ in range(rng.choice([1, 2])):
            _edit_byte(rng, b, b' ,:{}[]"\\0e.-+\xff\xc3\x80u')
        _agree(bytes(b))


def test_envelope_reads_duplicates_and_members_as_the_record_path():
    """The lane's envelope: the last of duplicate members (as orjson), no member besides payload and schema (the
    record path reads such a record as a bare payload), an absent schema as empty bytes."""
    env = D._read_envelope(b'{"payload":{"x":1},"schema":{"a":1},"payload":{"y":2},"schema":null}')
    assert env.payload == {"y": 2} and bytes(env.schema) == b"null"
    assert bytes(D._read_envelope(b'{"payload":{}}').schema) == b""
    for bad in (b'{"payload":{},"schema":{},"x":1}', b'{"schema":{}}', b'{"payload":[],"schema":{}}', b"[]",
                b'{"payload":{},"schema":{}} {}'):
        with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
            D._read_envelope(bad)


def test_schema_bytes_are_checked_by_the_record_path_once():
    """The schema is not parsed on the lane: a record with new schema bytes (here the same schema with a byte that
    is no UTF-8 in a name, which msgspec's raw reading lets through) is decoded whole by the record path first."""
    msgs = [m for m in _bench_messages() if m.partition == 0][8:]
    m, c = _row_value(msgs, "c")
    bad = m.value.replace(b'"name":"test_cluster.bench.', b'"name":"test_cluster.\xff.', 1)
    assert bad != m.value
    assert bytes(D._read_envelope(bad).schema) != bytes(D._read_envelope(m.value).schema)
    dec = _decoder()
    assert dec.decode_arrow([m], LIMIT) is not None
    assert _check([m, _with(m, bad)], dec) == "refused by both"


# ---- the column conversions -----------------------------------------------------------------------------------------

_POOL = [None, 0, 1, -1, 7, 2 ** 31, 2 ** 53 + 1, 2 ** 63 - 1, 2 ** 63, 2 ** 64 - 1, 2 ** 64, -2 ** 63, -2 ** 63 - 1,
         1.5, 2.0, -0.0, 0.1, 1e300, 1e-7, 1e-10, 1e22, 1e28, -1e28, 1e16, 123456.789, float("inf"), True, False, "",
         "a", "\u00e9", "\U0001F600", "AA==", "/w==", "AQID", "AA=", "2024-01-01T00:00:00Z",
         "2024-02-29T23:59:59.123456Z", "2024-01-01T00:00:00+08:00", "0000-01-01T00:00:00Z", "\ud800", [1], {"a": 1},
         2932896, 2932897, -719162, -719163, 253402300799999999, 253402300800000000, -62135596800000000,
         -62135596800000001, 253402300799999, 253402300800000, -62135596800000, -62135596800001, 9223372036854775,
         9223372036854776]


def _rules() -> list:
    return [*D._ARROW_RULES, D._make_zoned(D._UTC), D._make_zoned(D._zone("Asia/Shanghai"))]


@pytest.mark.parametrize("conv", _rules(), ids=lambda c: getattr(c, "__qualname__", repr(c)))
def test_column_conversions_give_what_the_converter_gives(conv):
    _, kind, convert = D._arrow_rule(conv)
    rng = random.Random(3)
    taken = 0
    for trial in range(400):
        values = [rng.choice(_POOL) for _ in range(rng.randrange(0, 8))]
        try:
            want = [None if v is None else conv(v) for v in values]
        except Exception:  # noqa: BLE001 - the converter refuses a value: so must the column
            want = None
        try:
            arr = convert(values)
        except Exception:  # noqa: BLE001
            continue
        assert want is not None, f"{values!r}: the column took what the converter refuses"
        got = V.to_python(kind, None, arr)
        assert [(type(g), repr(g)) for g in got] == [(type(w), repr(w)) for w in want], values
        assert arr.type == J.NULL_TYPES[kind] or (kind == V.INT and str(arr.type) == "uint64")
        taken += 1
    assert taken > 50


def test_float_and_decimal_columns_take_integers_as_the_converters_do():
    """JSON integers in a DOUBLE or (TiCDC's float-sent) DECIMAL column: Python's float(v) and Decimal(v) exactly
    (2**53 + 1 is no float: Arrow alone would refuse it); integers beyond 64 bits are refused, because orjson reads
    them as floats (a DECIMAL would get another value) while msgspec reads them as ints."""
    for v in (2 ** 53 + 1, -(2 ** 63), 2 ** 64 - 1):
        assert J.floats([v, None]).to_pylist() == [float(v), None]
        assert V.to_python(V.DECIMAL, None, J.number_texts([v])) == [D._conv_float_decimal(v)]
    for v in (2 ** 64, -(2 ** 63) - 1):
        with pytest.raises(V.Refused):
            J.floats([v])
        with pytest.raises(V.Refused):
            J.number_texts([v], conv=D._conv_float_decimal)


def test_slice_columns_keep_each_columns_own_type():
    """Columns of one conversion are converted together, but each keeps the Arrow type its own values give, and only
    a column's own values refuse it."""
    cols = J.Columns()
    a = cols.add("i", J.ints, [1, 2 ** 64 - 1, None])
    b = cols.add("i", J.ints, [0, 5])
    c = cols.add("i", J.ints, [7])
    d = cols.add("j", J.ints, [-1])
    e = cols.add("j", J.ints, [2 ** 63])
    f = cols.add("f", J.floats, [1.5, 2])
    got = cols.convert()
    assert got[a].type == got[e].type == pa.uint64() and got[a].to_pylist() == [1, 2 ** 64 - 1, None]
    assert got[b].type == got[c].type == got[d].type == pa.int64()
    assert [got[i].to_pylist() for i in (b, c, d, e)] == [[0, 5], [7], [-1], [2 ** 63]]
    assert got[f].to_pylist() == [1.5, 2.0]
    cols = J.Columns()
    cols.add("i", J.ints, [1])
    cols.add("i", J.ints, [-1, 2 ** 64 - 1])
    with pytest.raises(V.Refused):
        cols.convert()


def test_every_converter_of_ticdc_fields_has_a_rule():
    """What TiCDC's Debezium encoder sends: every field of the real stream's tables has a column rule."""
    dec = _decoder()
    for m in ticdc_real.messages("debezium", TOPIC):
        obj = orjson.loads(m.value) if m.value else None
        if obj and obj["payload"].get("op") in ("c", "u", "d"):
            _, convs = dec._columns_from_schema(obj["schema"], ())
            assert all(D._arrow_rule(c) is not None for c in convs.values())


def test_lane_shapes_are_bounded(monkeypatch):
    monkeypatch.setattr(D, "_CACHE_LIMIT", 3)
    msgs = [m for m in _bench_messages() if m.partition == 0][8:]
    m, c = _row_value(msgs, "c")
    dec = _decoder()
    for i in range(10):
        v = json.loads(json.dumps(c))
        v["schema"]["version"] = i  # the same columns, other schema bytes
        assert _check([_with(m, v)], dec) == "taken"
        assert len(dec._lanes) <= 3


# ---- the driver and the gate ---------------------------------------------------------------------------------------

def test_the_driver_decodes_with_the_lane_what_the_record_path_decodes():
    from applier.decode import decode_records

    msgs = _bench_messages(2000, 9)
    dec = _decoder()
    got = decode_records(dec, msgs, stop_at_error=True, columnar=True)
    want = decode_records(dec, msgs, stop_at_error=True, columnar=False)
    assert got.batches and not want.batches
    assert got.messages == want.messages == len(msgs)
    lane = [e for b in got.batches for e in b.to_events()] + got.events
    key = lambda e: (e.position.partition, e.position.offset)  # noqa: E731 - one event per message
    assert sorted(lane, key=key) == sorted(want.events, key=key)


def test_spark_workers_send_the_lane_s_slices_to_the_driver():
    """A worker (``decode_arrow_batches`` with ``columnar``) decodes a gated Debezium stream on the lane and ships
    the slices as Arrow IPC; the driver's chunks give back the record path's events."""
    from applier import decode as DC

    msgs = [m for m in _bench_messages(1200, 4) if m.partition == 1]
    spec = DC.WorkerSpec("debezium", tuple(sorted(GATED.items())), True, columnar=True)
    rb = pa.RecordBatch.from_arrays(
        [pa.array([m.topic for m in msgs], pa.string()), pa.array([m.partition for m in msgs], pa.int32()),
         pa.array([m.offset for m in msgs], pa.int64()), pa.array([m.key for m in msgs], pa.binary()),
         pa.array([m.value for m in msgs], pa.binary())], names=["topic", "partition", "offset", "key", "value"])
    chunks = [c for out in DC.decode_arrow_batches(spec, iter([rb])) for c in out.column(0).to_pylist()]
    got = DC.decode_chunks(chunks)
    assert got.batches and got.messages == len(msgs)
    events = [e for b in got.batches for e in b.to_events()] + got.events
    want = _record_by_record(msgs)
    key = lambda e: (e.position.offset, type(e).__name__)  # noqa: E731 - one event per message
    assert _exact(sorted(events, key=key)) == _exact(sorted(want, key=key))


def _with_watermarks(msgs: list[KafkaMessage], every: int) -> list[KafkaMessage]:
    """``msgs`` with a watermark (op "m") after every ``every`` records of each partition, each as high as the stream
    allows there (one below the lowest commit ts of a row still to come in that partition), offsets renumbered: so
    that releases cut through held row batches."""
    template = next(m for m in msgs if _has([m], Resolved))
    tv = orjson.loads(template.value)
    out = []
    for part, ms in per_partition(msgs).items():
        lows: list[int | None] = []
        low = None
        for m in reversed(ms):
            lows.append(low)
            ts = [e.commit_ts for e in _record_by_record([m]) if type(e) is RowChange]
            if ts:
                low = min([ts[0]] if low is None else [low, ts[0]])
        lows.reverse()
        off = 0
        for i, m in enumerate(ms):
            out.append(KafkaMessage(m.topic, part, off, m.key, m.value))
            off += 1
            if (i + 1) % every == 0 and lows[i] is not None:
                tv["payload"]["source"]["commit_ts"] = lows[i] - 1
                out.append(KafkaMessage(m.topic, part, off, template.key, orjson.dumps(tv)))
                off += 1
    return out


@pytest.mark.parametrize("seed, budget", [(1, 512 * 1024 * 1024), (2, 64 * 1024), (3, 1)])
def test_gate_with_batches_releases_what_the_event_gate_releases(seed, budget, tmp_path):
    def same(got: list, want: list) -> None:
        assert got == want

    gate_differential("debezium", _with_watermarks(_bench_messages(3000, seed), 17), random.Random(seed), budget,
                      tmp_path, most=300, slice_size=61, same=same, options=GATED)


@pytest.mark.parametrize("stream", ["bench", "real"])
def test_the_arrow_plan_of_the_lane_s_batches_is_plan_batch(stream):
    """Downstream of the lane: the per-key plan on its batches (plan_arrow, every table's batches of the slice
    concatenated) is plan_batch on the record path's events, value types included (TIME as duration, DECIMAL as
    text, BIGINT UNSIGNED as uint64)."""
    from applier.columnar.plan import plan_arrow, to_batch_plan
    from applier.columnar.rows import concat_batches
    from applier.sinks.plan import plan_batch
    from applier.sinks.table import build_meta
    from tests.unit.arrow_lane import strict

    if stream == "bench":
        msgs = [m for m in _bench_messages(3000, 2) if m.partition == 0]
    else:
        msgs = [m for m in ticdc_real.messages("debezium", TOPIC) if not _has([m], DDL)][:400]
    got = _decoder().decode_arrow(msgs, LIMIT)
    rows = [e for e in _record_by_record(msgs) if type(e) is RowChange]
    tables: dict[tuple[str, str], list] = {}
    for b in got.batches:
        tables.setdefault((b.shape.schema, b.shape.table), []).append(b)
    for (schema, table), batches in tables.items():
        b = concat_batches(batches)
        names, kinds = b.shape.names, dict(zip(b.shape.names, b.shape.kinds))
        key = tuple(c.name for c in b.shape.variants[0] if c.key)
        meta = build_meta(schema, table, [(c, True, False) for c in names], key, [])
        want = strict(plan_batch(meta, [e for e in rows if (e.schema, e.table) == (schema, table)]))
        plan = plan_arrow(meta, pa.Table.from_batches([b.data]), names)
        assert strict(to_batch_plan(meta, plan, lambda c, arr: V.to_python(kinds[c], None, arr))) == want
    assert len(tables) >= 3
