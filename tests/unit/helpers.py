"""Helpers the unit tests share: value strategies per MySQL type, row comparison, decoder fuzzing, messages.

Why a module of its own: several codec test modules used to import these from another test module.
"""

from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from pathlib import Path
from typing import Iterator

from hypothesis import strategies as st

from applier import mysql_values as T
from applier.events import KafkaMessage, RowChange

_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40)
TIME_MIN = -dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=999999)
TIME_MAX = dt.timedelta(hours=838, minutes=59, seconds=59, microseconds=999999)

#: (type name, unsigned) -> strategy of Python values as the event model holds them for TiCDC's protocols
VALUE_STRATEGIES: dict[tuple[str, bool], st.SearchStrategy] = {
    ("tinyint", False): st.integers(-(2**7), 2**7 - 1),
    ("tinyint", True): st.integers(0, 2**8 - 1),
    ("smallint", False): st.integers(-(2**15), 2**15 - 1),
    ("smallint", True): st.integers(0, 2**16 - 1),
    ("mediumint", False): st.integers(-(2**23), 2**23 - 1),
    ("mediumint", True): st.integers(0, 2**24 - 1),
    ("int", False): st.integers(-(2**31), 2**31 - 1),
    ("int", True): st.integers(0, 2**32 - 1),
    ("bigint", False): st.integers(-(2**63), 2**63 - 1),
    ("bigint", True): st.integers(0, 2**64 - 1) | st.just(2**64 - 1),
    ("float", False): st.floats(width=32, allow_nan=False, allow_infinity=False),
    ("double", False): st.floats(allow_nan=False, allow_infinity=False),
    ("decimal", False): st.decimals(min_value=Decimal("-1e20"), max_value=Decimal("1e20"), places=6,
                                    allow_nan=False, allow_infinity=False),
    ("date", False): st.dates() | st.just("0000-00-00"),
    ("datetime", False): st.datetimes() | st.just("0000-00-00 00:00:00"),
    ("timestamp", False): st.datetimes(min_value=dt.datetime(1970, 1, 1, 0, 0, 1),
                                       max_value=dt.datetime(2038, 1, 19, 3, 14, 7)),
    ("time", False): st.timedeltas(min_value=TIME_MIN, max_value=TIME_MAX),
    ("year", False): st.integers(1901, 2155) | st.just(0),
    ("char", False): _text,
    ("varchar", False): _text,
    ("tinytext", False): _text,
    ("text", False): _text,
    ("mediumtext", False): _text,
    ("longtext", False): _text,
    ("binary", False): st.binary(max_size=40),
    ("varbinary", False): st.binary(max_size=40),
    ("tinyblob", False): st.binary(max_size=40),
    ("blob", False): st.binary(max_size=40),
    ("mediumblob", False): st.binary(max_size=40),
    ("longblob", False): st.binary(max_size=40),
    ("bit", False): st.integers(0, 2**64 - 1),
    # TiCDC's open and canal-json send ENUM/SET as their ordinal / bitmask integers
    ("enum", False): st.integers(1, 65535),
    ("set", False): st.integers(0, 2**64 - 1),
    ("json", False): st.recursive(
        st.none() | st.booleans() | st.integers(-(2**53), 2**53) | _text,
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(_text, inner, max_size=3),
        max_leaves=6,
    ).map(lambda v: json.dumps(v, ensure_ascii=False)),
}


def values_equal(type_name: str, a, b) -> bool:
    """Equality after a round trip: FLOAT columns keep float32 precision (TiCDC prints the shortest text)."""
    if type_name == "float" and a is not None and b is not None:
        return T.float32(a) == T.float32(b)
    return a == b and type(a) is type(b)


def assert_same_row(got: RowChange, want: RowChange, *, nullable: bool = True) -> None:
    """A decoded row equals the encoded one: identity, images value by value (by type), column metadata.
    ``nullable=False`` for protocols that do not carry nullability (Canal-JSON)."""
    assert (got.schema, got.table, got.commit_ts, got.op) == (want.schema, want.table, want.commit_ts, want.op)
    types = {c.name: c.type_name for c in want.columns}
    for g, w in ((got.before, want.before), (got.after, want.after)):
        assert (g is None) == (w is None)
        if w is None:
            continue
        assert list(g) == list(w)
        for name in w:
            assert values_equal(types[name], g[name], w[name]), (name, types[name], g[name], w[name])
    got_cols = {c.name: c for c in got.columns}
    for c in want.columns:
        g = got_cols[c.name]
        fields = ("type_name", "key", "nullable", "unsigned", "binary") if nullable else (
            "type_name", "key", "unsigned", "binary")
        assert tuple(getattr(g, f) for f in fields) == tuple(getattr(c, f) for f in fields), c


def mutate_bytes(draw, data: bytes, *, steps: tuple[int, int], special: bytes, dup: bool = False) -> bytes:
    """Fuzzing input for decoders: a valid message with a few bit flips, byte sets (from ``special``),
    insertions, deletions, truncations and (``dup``) duplicated stretches. ``draw`` is hypothesis's."""
    actions = ["flip", "set", "insert", "delete", "truncate"] + (["dup"] if dup else [])
    buf = bytearray(data)
    for _ in range(draw(st.integers(*steps))):
        action = draw(st.sampled_from(actions))
        if action == "truncate":
            buf = buf[: draw(st.integers(0, len(buf)))]
            continue
        if not buf:
            buf += draw(st.binary(min_size=1, max_size=4))
            continue
        i = draw(st.integers(0, len(buf) - 1))
        if action == "flip":
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif action == "set":
            buf[i] = draw(st.sampled_from(special))
        elif action == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif action == "delete":
            del buf[i : i + draw(st.integers(1, 8))]
        else:
            j = draw(st.integers(i, len(buf)))
            buf[j:j] = buf[i:j]
    return bytes(buf)


def workload_ddl(vectors: Path) -> Iterator[tuple[str, str, str]]:
    """(workload, schema, statement) for every DDL statement of the TiCDC integration workloads."""
    from applier.ddl.lexer import significant, split_statements, tokenize

    for f in sorted((vectors / "workloads").glob("*/*.sql")):
        schema = "test"
        for stmt in split_statements(f.read_text()):
            sig = significant(tokenize(stmt))
            head = sig[0].upper
            if head == "USE":
                schema = sig[1].ident
            elif head in ("CREATE", "ALTER", "DROP", "RENAME", "TRUNCATE", "RECOVER"):
                yield f.parent.name, schema, stmt


def kafka_msg(key: bytes | None, value: bytes | None, *, topic: str = "orders", partition: int = 3,
              offset: int = 42) -> KafkaMessage:
    """A Kafka record as the pipeline hands it to a decoder (codec tests bind their own defaults with partial)."""
    return KafkaMessage(topic=topic, partition=partition, offset=offset, key=key, value=value)


#: a configuration that parses, naming services that do not answer (port 1): for CLI tests without services
CLI_CONF = """
[pipeline]
name = "p"
checkpoint_dir = "{ckpt}"
[source]
bootstrap_servers = "127.0.0.1:1"
topics = ["a"]
protocol = "open"
[target]
url = "mysql+pymysql://u:Sup3rS3cret@127.0.0.1:1/db"
"""


def write_conf(tmp_path: Path, text: str = CLI_CONF) -> str:
    """``text`` as ``tmp_path/c.toml`` with ``{ckpt}`` filled in; its path."""
    p = tmp_path / "c.toml"
    p.write_text(text.format(ckpt=tmp_path / "ck"))
    return str(p)


def same_events(got: list, want: list) -> None:
    """Two decodes' events are the same: types, positions, sizes, column metadata, and values exactly (same
    types: Decimal stays Decimal, bytes stay bytes; same key order)."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert type(g) is type(w)
        if isinstance(w, RowChange):
            assert (g.schema, g.table, g.commit_ts, g.op, g.position, g.size, g.columns) == \
                   (w.schema, w.table, w.commit_ts, w.op, w.position, w.size, w.columns)
            # values exactly: same types (Decimal stays Decimal, bytes stay bytes), same key order
            for gi, wi in ((g.before, w.before), (g.after, w.after)):
                assert (gi is None) == (wi is None)
                if wi is not None:
                    assert list(gi.items()) == list(wi.items())
                    assert [type(v) for v in gi.values()] == [type(v) for v in wi.values()]
        else:
            assert g == w
