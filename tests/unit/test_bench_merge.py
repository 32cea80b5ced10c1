"""The PostgreSQL merge-path yardstick's pure parts (applier.devtools.bench_merge) and the workload's plain row-change
view it feeds on (BenchWorkload.row_changes); the measurement itself needs PostgreSQL and runs in the bench."""

from __future__ import annotations

import collections

import pytest

from applier.devtools.bench_merge import (change_getter, chunks, collapse, format_merge, merge_ratios, merge_statements,
                                          split_checksums)
from applier.devtools.bench_stream import BENCH_COLUMN_NAMES, bench_canonical, bench_checksum, bench_row, generate_bench
from applier.events import Op, RowChange, SourcePosition

POS = SourcePosition("t", 0, 0)


def _workload(**kw):
    opts = dict(tables=3, partitions=2, events=3000, big_txn_rows=400, seed=7, hot_keys=4, dup_fraction=0.05)
    opts.update(kw)
    return generate_bench("canal-json", **opts)


def test_collapse_keeps_the_last_change_of_each_key() -> None:
    ups, dels = collapse([
        (1, ("a", 1)), (1, ("a", 2)),  # insert then update: the update's row
        (2, ("b", 1)), (2, None),  # insert then delete: a delete (the key may exist in the target)
        (3, None), (3, ("c", 9)),  # delete then insert again: the new row
        (4, None),
        (5, ("e", 1)),
    ])
    assert sorted(ups) == [("a", 2), ("c", 9), ("e", 1)]
    assert sorted(dels) == [(2,), (4,)]


def test_collapse_never_puts_a_key_in_both_statements() -> None:
    import random
    rng = random.Random(3)
    changes = [(rng.randrange(20), None if rng.random() < 0.3 else (rng.random(),)) for _ in range(500)]
    ups, dels = collapse(changes)
    last = {k: r for k, r in changes}
    assert len(ups) + len(dels) == len(last)
    assert {k for (k,) in dels} == {k for k, r in last.items() if r is None}
    assert sorted(ups) == sorted(r for r in last.values() if r is not None)


def test_chunks() -> None:
    assert list(chunks(range(7), 3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert list(chunks([], 3)) == []
    with pytest.raises(ValueError):
        list(chunks([1], 0))


def test_change_getter_keeps_the_tables_apart_and_split_checksums_inverts_it() -> None:
    names = ["t00", "t01", "t02"]
    get = change_getter(names)
    a, b = bench_row(1, 5, 1), bench_row(1, 5, 2)
    key, row = get(RowChange("bench", "t01", 1, Op.UPDATE, a, b, (), POS))
    assert key == 5 * 3 + 1 and row[0] == key and row[1:] == tuple(b[c] for c in BENCH_COLUMN_NAMES)[1:]
    assert get(RowChange("bench", "t02", 1, Op.DELETE, a, None, (), POS)) == (5 * 3 + 2, None)
    assert get(RowChange("bench", "t00", 1, Op.INSERT, None, a, (), POS))[0] == 15
    merged = [dict(zip(BENCH_COLUMN_NAMES, row))]
    got = split_checksums(merged, names)
    assert (got["t01"].rows, got["t01"].digest_sum) == (1, bench_checksum([b]).digest_sum)
    assert got["t00"].rows == got["t02"].rows == 0


def test_merge_statements() -> None:
    q = lambda c: f'"{c}"'  # noqa: E731
    sql = merge_statements('"s"."m"', '"up"', '"del"', ("id", "a", "b"), "id", q)
    assert sql["upsert"] == ('INSERT INTO "s"."m" ("id", "a", "b") SELECT "id", "a", "b" FROM "up" '
                             'ON CONFLICT ("id") DO UPDATE SET "a" = EXCLUDED."a", "b" = EXCLUDED."b"')
    assert sql["delete"] == 'DELETE FROM "s"."m" AS t USING "del" AS d WHERE t."id" = d."id"'
    assert sql["copy_up"] == 'COPY "up" ("id", "a", "b") FROM STDIN'
    assert sql["copy_del"] == 'COPY "del" ("id") FROM STDIN'
    assert "ON COMMIT DELETE ROWS" in sql["create_up"] and "WITH NO DATA" in sql["create_del"]
    assert sql["drop_stages"] == 'DROP TABLE IF EXISTS pg_temp."up", pg_temp."del"'


def test_merge_ratios_and_report_lines() -> None:
    assert merge_ratios(10_000.0, None) == {} and format_merge(None, {}) == []
    merge = {"rows": 50_000, "rows_per_s": 40_000.0, "batches": 10, "batch_rows": 5000, "rows_written": 41_000,
             "copy_format": "binary"}
    ratios = merge_ratios(10_000.0, merge)
    assert ratios == {"events_per_s_to_merge_path_rows_per_s": 0.25}
    lines = format_merge(merge, ratios)
    assert "40,000" in lines[0] and "10 transactions of 5,000" in lines[0] and "COPY binary" in lines[0]
    assert "0.250" in lines[1]
    assert merge_ratios(None, merge) == {"events_per_s_to_merge_path_rows_per_s": None}
    assert "n/a" in format_merge({**merge, "rows_per_s": None}, merge_ratios(1.0, {**merge, "rows_per_s": None}))[1]


def test_row_changes_are_the_upstream_changes_the_messages_carry() -> None:
    """Decoded messages without TiCDC's replays == row_changes(), change for change, and the same expected state."""
    from applier.codecs import get_decoder
    from applier.events import KafkaMessage

    def sig(ev: RowChange) -> tuple:  # values compared in one text form, whatever types the decoder returns
        return (ev.commit_ts, ev.table, (ev.after or ev.before)["id"], ev.op,
                bench_canonical(ev.after) if ev.after else None)

    encoded = _workload()
    dec = get_decoder("canal-json")
    offsets: collections.Counter = collections.Counter()
    seen = set()
    from_messages = []
    for part, key, value in encoded.messages():
        for ev in dec.decode(KafkaMessage("t", part, offsets[part], key, value)):
            if isinstance(ev, RowChange) and sig(ev) not in seen:  # a replay re-sends a change: counted once
                seen.add(sig(ev))
                from_messages.append(sig(ev))
        offsets[part] += 1
    plain = _workload()
    from_plain = [sig(ev) for ev in plain.row_changes()]
    assert len(from_plain) == plain.stats.row_events == encoded.stats.row_events == 3000
    assert sorted(from_plain) == sorted(from_messages)
    assert plain.expected == encoded.expected and plain.final_ts == encoded.final_ts
    assert plain.stats.messages == 0 and plain.stats.duplicate_row_events == 0
    with pytest.raises(RuntimeError):
        next(plain.row_changes())  # single use, like messages()


def test_collapsed_batches_reach_the_generators_final_state() -> None:
    """The yardstick's logic without a database: batches of the plain changes, collapsed, applied to a dict by
    merged key; the per-table checksums of the result are the generator's (hot keys and PK changes included)."""
    wl = _workload(events=5000, big_txn_rows=1200)
    get = change_getter(wl.table_names)
    state: dict[int, tuple] = {}
    for batch in chunks(wl.row_changes(), 97):
        ups, dels = collapse(map(get, batch))
        for row in ups:
            state[row[0]] = row
        for (k,) in dels:
            state.pop(k, None)
    got = split_checksums((dict(zip(BENCH_COLUMN_NAMES, r)) for r in state.values()), wl.table_names)
    assert {t: (c.rows, c.digest_sum) for t, c in got.items()} == {
        t: (c.rows, c.digest_sum) for t, c in wl.expected.items()}
    assert wl.stats.key_changes > 0 and wl.stats.deletes > 0
