"""applier.codecs.canal_maps: a shape's map recognised from raw JSON text, key order aside, exactly when the text
parses to an equal map (the lane then takes the shape without building a dict)."""

from __future__ import annotations

import random

import msgspec
import orjson
import pytest

from applier.codecs.canal_maps import KNOWN_TEXTS, MapMatch

MYSQL = {"id": "bigint", "grp": "int unsigned", "name": "varchar", "é x": "decimal", "": "text"}
SQL = {"id": -5, "grp": 4, "name": 12, "note": None}


def _raw(text: str | bytes) -> msgspec.Raw:
    """A Raw as the lane gets it: a view of a larger message."""
    value = text.encode() if isinstance(text, str) else text
    return msgspec.json.decode(b'{"m":' + value + b"}", type=dict[str, msgspec.Raw])["m"]


def _parses_equal(mapping: dict, text: bytes) -> bool:
    try:
        return orjson.loads(text) == mapping and all(
            type(v) is type(mapping[k]) for k, v in orjson.loads(text).items())
    except orjson.JSONDecodeError:
        return False


@pytest.mark.parametrize("mapping", [MYSQL, SQL, {}])
def test_any_order_is_the_shapes_map(mapping):
    match = MapMatch(mapping, None)
    rng = random.Random(3)
    for _ in range(30):
        items = list(mapping.items())
        rng.shuffle(items)
        assert match(_raw(orjson.dumps(dict(items))))


@pytest.mark.parametrize("text", [
    b'{"id":-5,"grp":4,"name":12}',  # a key missing
    b'{"id":-5,"grp":4,"name":12,"note":null,"x":1}',  # one more
    b'{"id":-5,"grp":-5,"name":12,"note":null}',  # a value changed (TiCDC's unsigned promotion)
    b'{"id":-5,"grp":4.0,"name":12,"note":null}',  # 4.0 == 4 in Python: a dict comparison would take it
    b'{"id":-5,"grp":true,"name":12,"note":null}',
    b'{"id":-5,"grp":"4","name":12,"note":null}',
    b'{"id":-5,"grp":4,"name":12,"note":0}',
    b'null', b'[]', b'"x"', b'{}',
])
def test_only_an_equal_map_matches(text):
    assert not _parses_equal(SQL, text)
    assert not MapMatch(SQL, None)(_raw(text))


def test_a_duplicate_key_whose_first_value_differs_is_left_to_the_caller():
    """The dict keeps the last value, so this text parses to the shape's map; the struct refuses it, and the lane
    then parses the map itself (a slower "no", never a wrong "yes")."""
    text = b'{"id":-5,"grp":5,"grp":4,"name":12,"note":null}'
    assert _parses_equal(SQL, text)
    assert not MapMatch(SQL, None)(_raw(text))
    assert MapMatch(SQL, None)(_raw(b'{"id":-5,"grp":4,"grp":4,"name":12,"note":null}'))


def test_a_match_is_exactly_an_equal_map():
    """Random edits of the shape's text: the matcher says yes only where the text parses to the same map with the
    same value types (what the lane's dict comparison plus its integer-only types said before)."""
    rng = random.Random(11)
    edits = [lambda v: v, lambda v: 4.0 if type(v) is int else v, lambda v: -v if type(v) is int else v,
             lambda v: None, lambda v: str(v), lambda v: v + "x" if type(v) is str else v, lambda v: True]
    for mapping in (MYSQL, SQL):
        match = MapMatch(mapping, None)
        for _ in range(300):
            items = list(mapping.items())
            rng.shuffle(items)
            if rng.random() < 0.3:
                k, v = rng.choice(items)
                items[items.index((k, v))] = (k, rng.choice(edits)(v))
            if rng.random() < 0.1:
                items.pop()
            if rng.random() < 0.1:
                items.append(("extra", "int"))
            text = orjson.dumps(dict(items))
            assert match(_raw(text)) == _parses_equal(mapping, text), text


def test_known_texts_are_remembered_and_bounded():
    match = MapMatch(SQL, _raw(orjson.dumps(SQL)))
    assert len(match.texts) == 1
    assert match(_raw(orjson.dumps(SQL)))
    assert len(match.texts) == 1  # known: not parsed, not added
    rng = random.Random(5)
    for _ in range(100):
        items = list(SQL.items())
        rng.shuffle(items)
        match(_raw(b" " * rng.randrange(3) + orjson.dumps(dict(items))))
    assert len(match.texts) == KNOWN_TEXTS
    assert not match.parses(_raw(b'{"id":-5}')) and len(match.texts) == KNOWN_TEXTS


def test_a_remembered_text_outlives_the_message_it_came_from():
    """The matcher keeps a copy, not a view of the message's buffer."""
    buf = bytearray(b'{"m":' + orjson.dumps(SQL) + b"}")
    raw = msgspec.json.decode(bytes(buf), type=dict[str, msgspec.Raw])["m"]
    match = MapMatch(SQL, raw)
    del raw, buf
    assert match(_raw(orjson.dumps(SQL))) and match.texts[0] == msgspec.Raw(orjson.dumps(SQL))
