"""Which apply stream a table goes to (issue 26): by its routed target, so a shard merge stays in one stream; the
same in every process and Python version (CRC-32, not the salted ``hash()``); spread over the streams."""

from __future__ import annotations

import subprocess
import sys
import zlib
from collections import Counter

import pytest

from applier.streams.assign import StreamAssignment, target_key, target_stream


def merge_shards(schema: str, table: str) -> tuple[str, str] | None:
    """db_1.orders_1, db_2.orders_7... -> shop.orders; "skip.*" is not routed; anything else keeps its name."""
    if schema == "skip":
        return None
    if schema.startswith("db_") and table.startswith("orders_"):
        return ("shop", "orders")
    return (schema, table)


def test_the_shards_of_a_merge_share_their_targets_stream() -> None:
    a = StreamAssignment(8, merge_shards)
    shards = {a.stream_of(f"db_{i}", f"orders_{j}") for i in range(10) for j in range(10)}
    assert shards == {a.stream_of("shop", "orders")} == {target_stream("shop", "orders", 8)}


def test_the_stream_is_crc32_of_the_targets_name_by_hand() -> None:
    # zlib.crc32(b"shop\x00orders") == 3037741618: pinned, so a change of encoding or hash shows here
    assert zlib.crc32(b"shop\x00orders") == 3037741618
    assert target_key("shop", "orders") == b"shop\x00orders"
    assert StreamAssignment(4, merge_shards).stream_of("db_3", "orders_9") == 3037741618 % 4 == 2
    assert StreamAssignment(7, merge_shards).stream_of("shop", "orders") == 3037741618 % 7 == 2
    # non-ASCII names go as UTF-8: zlib.crc32("商店\x00订单".encode()) == 2368588742
    assert StreamAssignment(5, merge_shards).stream_of("商店", "订单") == 2368588742 % 5 == 2


def test_the_same_in_another_process_whatever_its_hash_seed() -> None:
    names = [(f"s{i}", f"t{i}") for i in range(50)]
    here = [StreamAssignment(6, merge_shards).stream_of(s, t) for s, t in names]
    code = ("from applier.streams.assign import target_stream\n"
            f"print([target_stream(s, t, 6) for s, t in {names!r}])")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                             env={"PYTHONHASHSEED": seed, "PYTHONPATH": ":".join(sys.path)}).stdout
        assert out.strip() == repr(here)


def test_many_tables_spread_over_every_stream() -> None:
    a = StreamAssignment(4, merge_shards)
    counts = Counter(a.stream_of("app", f"table_{i}") for i in range(400))
    assert set(counts) == {0, 1, 2, 3}
    assert min(counts.values()) >= 70  # 100 each on average


def test_a_table_no_route_keeps_goes_to_stream_0() -> None:
    a = StreamAssignment(4, merge_shards)
    assert {a.stream_of("skip", f"t{i}") for i in range(20)} == {0}


def test_one_stream_is_always_0_and_routes_nothing() -> None:
    def refuse(schema: str, table: str) -> tuple[str, str] | None:
        raise AssertionError("n == 1 needs no route")

    a = StreamAssignment(1, refuse)
    assert {a.stream_of("app", f"t{i}") for i in range(20)} == {0}


def test_answers_are_cached_per_upstream_table() -> None:
    calls: list[tuple[str, str]] = []

    def route(schema: str, table: str) -> tuple[str, str] | None:
        calls.append((schema, table))
        return (schema, table)

    a = StreamAssignment(3, route)
    assert a.stream_of("app", "t") == a.stream_of("app", "t") == a.stream_of("app", "t")
    assert calls == [("app", "t")]


def test_n_below_1_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        StreamAssignment(0, merge_shards)
