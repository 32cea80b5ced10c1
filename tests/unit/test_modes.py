"""Route modes history and soft_delete (applier.modes), without a database: the columns and key API, the planning
of a table's changes into each mode's writes, what a table needs to be written in a mode and the DDL that gives it,
the ``mode`` key of ``[[route]]``, and the DDL a moded route refuses.

The planning is checked against a reference worked out from the change list by a different rule (the table's state
before and after each commit ts, diffed), with the writers' SQL modelled in Python (:func:`apply_history`,
:func:`apply_soft`): the target must come out the same whatever windows the stream is cut into, and a replay from
the start over a target that holds part or all of it changes nothing.
"""

from __future__ import annotations

import datetime as dt
import random
from types import SimpleNamespace

import pytest
from sqlalchemy.dialects import mysql as sa_mysql, postgresql as sa_pg

from applier.config import ConfigError, parse_config
from applier.ddl import UnsupportedDDL, translate
from applier.ddl.pg_types import pg_type
from applier.ddl.syntax import MyType
from applier.dialect import MYSQL, POSTGRES
from applier.events import Column, Op, Resolved, RowChange, SourcePosition
from applier.modes import (
    COMMIT_TS, DELETED, DELETED_AT, OP, VALID_FROM, VALID_TO, Conform, ModeError, TableShape, UniqueIndex,
    commit_time, conform, mode_columns, mode_key, plan_history, plan_soft_delete,
)
from applier.pipeline import router_for
from applier.routing import Router, Rule, RuleError
from applier.sinks.table import ApplyError, build_meta

COLS = (Column("id", "int", nullable=False, key=True), Column("v", "int"))
MS = 1_700_000_000_000


def ts_of(n: int) -> int:
    return ((MS + n) << 18) + 7


def meta(extra: tuple[str, ...] = (), generated: tuple[str, ...] = ()):
    cols = [("id", False, False), ("v", True, False), *((c, True, c in generated) for c in extra)]
    return build_meta("s", "t", cols, ("id",), [])


def ch(n: int, op: Op, before=None, after=None, off: int = 0) -> RowChange:
    return RowChange("up", "t", ts_of(n), op, before, after, COLS, SourcePosition("k", 0, off))


def r(i: int, v: int, **more) -> dict:
    return {"id": i, "v": v, **more}


# ---- the API schema evolution builds tables with ------------------------------------------------------------------

def test_mode_columns_and_mode_key_are_the_documented_api() -> None:
    assert mode_columns("replica") == ()
    assert [tuple(c) for c in mode_columns("history")] == [
        ("_commit_ts", "BIGINT UNSIGNED", False), ("_op", "VARCHAR(6)", False), ("_valid_from", "DATETIME(6)", False),
        ("_valid_to", "DATETIME(6)", True)]
    assert [tuple(c) for c in mode_columns("soft_delete")] == [("_deleted", "BOOLEAN", False),
                                                               ("_deleted_at", "DATETIME(6)", True)]
    name, typ, nullable = mode_columns("history")[0]  # a 3-tuple, as documented
    assert (name, typ, nullable) == ("_commit_ts", "BIGINT UNSIGNED", False)
    assert mode_key("history", ("a", "b")) == ("a", "b", "_commit_ts")
    assert mode_key("soft_delete", ["a"]) == ("a",) and mode_key("replica", ()) == ()
    assert [c.default for c in mode_columns("soft_delete")] == ["false", None]
    with pytest.raises(ValueError, match="unknown route mode 'scd2'"):
        mode_columns("scd2")


def test_postgresql_types_are_the_translators_except_boolean() -> None:
    """The PostgreSQL DDL translator's type map, so a table the applier creates from a MySQL type has the same
    columns as one schema evolution creates; BOOLEAN is PostgreSQL's boolean (NOT _deleted reads alike)."""
    parsed = {"BIGINT UNSIGNED": MyType("bigint", unsigned=True), "VARCHAR(6)": MyType("varchar", ["6"]),
              "DATETIME(6)": MyType("datetime", ["6"])}
    for c in mode_columns("history") + mode_columns("soft_delete"):
        assert c.pg_type == ("boolean" if c.type == "BOOLEAN" else pg_type(parsed[c.type]))


def test_commit_time_is_the_tso_physical_time_exactly() -> None:
    assert commit_time(((1_700_000_000_123) << 18) | 0x3FFFF) == dt.datetime(2023, 11, 14, 22, 13, 20, 123000)
    assert commit_time(ts_of(0)).tzinfo is None


# ---- history planning -----------------------------------------------------------------------------------------

def versions(plan) -> list[tuple]:
    return [(v["id"], v[COMMIT_TS], v[OP], v["v"], v[VALID_FROM], v[VALID_TO]) for v in plan.versions]


def test_every_change_is_a_version_chained_per_key() -> None:
    p = plan_history(meta(), ("id",), [ch(1, Op.INSERT, after=r(1, 10)), ch(2, Op.UPDATE, r(1, 10), r(1, 11)),
                                       ch(3, Op.DELETE, before=r(1, 11)), ch(4, Op.INSERT, after=r(1, 12))])
    t = [commit_time(ts_of(n)) for n in range(5)]
    assert versions(p) == [(1, ts_of(1), "insert", 10, t[1], t[2]), (1, ts_of(2), "update", 11, t[2], t[3]),
                           (1, ts_of(3), "delete", 11, t[3], t[4]), (1, ts_of(4), "insert", 12, t[4], None)]
    # each version closes the open version between the one before it (0: the first) and itself
    assert p.closes == [((1,), ts_of(1), 0, t[1]), ((1,), ts_of(2), ts_of(1), t[2]),
                        ((1,), ts_of(3), ts_of(2), t[3]), ((1,), ts_of(4), ts_of(3), t[4])]


def test_a_key_changing_update_is_a_delete_of_the_old_key_and_an_insert_of_the_new() -> None:
    p = plan_history(meta(), ("id",), [ch(1, Op.UPDATE, r(1, 10), r(2, 10))])
    assert [(v["id"], v[OP], v["v"]) for v in p.versions] == [(1, "delete", 10), (2, "insert", 10)]


@pytest.mark.parametrize("reverse", [False, True])
def test_two_updates_swapping_keys_in_one_commit_ts_lose_nothing(reverse: bool) -> None:
    swap = [ch(1, Op.UPDATE, r(4, 40), r(5, 40)), ch(1, Op.UPDATE, r(5, 50), r(4, 50))]
    p = plan_history(meta(), ("id",), swap[::-1] if reverse else swap)
    assert sorted((v["id"], v[OP], v["v"], v[VALID_TO]) for v in p.versions) == [(4, "update", 50, None),
                                                                                 (5, "update", 40, None)]
    s = plan_soft_delete(meta(), swap[::-1] if reverse else swap)
    assert sorted(s.hard_deletes) == [(4,), (5,)] and s.soft_deletes == []
    assert sorted((u["id"], u["v"], u[DELETED]) for u in s.upserts) == [(4, 50, False), (5, 40, False)]


def test_ticdcs_split_update_folds_into_one_version_per_key_and_commit_ts() -> None:
    # TiCDC sends a unique-key-changing update as delete + insert of the same key in one commit ts
    p = plan_history(meta(), ("id",), [ch(1, Op.INSERT, after=r(1, 1)), ch(2, Op.DELETE, before=r(1, 1)),
                                       ch(2, Op.INSERT, after=r(1, 2))])
    assert [(v[COMMIT_TS], v[OP], v["v"]) for v in p.versions] == [(ts_of(1), "insert", 1), (ts_of(2), "update", 2)]


def test_version_rows_are_copies_of_the_writable_columns() -> None:
    ev = ch(1, Op.INSERT, after=r(1, 1, g=5))
    p = plan_history(meta(extra=("g",), generated=("g",)), ("id",), [ev])
    assert "g" not in p.versions[0] and ev.after == r(1, 1, g=5)
    with pytest.raises(ApplyError, match=r"column\(s\) 'zz' that target table s\.t lacks"):
        plan_history(meta(), ("id",), [ch(1, Op.INSERT, after=r(1, 1, zz=1))])
    with pytest.raises(ApplyError, match="'_op', which the route's mode writes itself"):
        plan_history(meta(extra=("_op",)), ("id",), [ch(1, Op.INSERT, after=r(1, 1, _op="x"))])
    with pytest.raises(ApplyError, match="lacks key column 'id'"):
        plan_history(meta(), ("id",), [ch(1, Op.INSERT, after={"v": 1})])


# ---- soft delete planning ---------------------------------------------------------------------------------------

def test_a_deleted_row_is_kept_deleted_with_the_time_of_its_delete() -> None:
    # written in an earlier window: only the flags are set on the row the target holds
    p = plan_soft_delete(meta(), [ch(3, Op.DELETE, before={"id": 1})])
    assert p.soft_deletes == [((1,), commit_time(ts_of(3)))] and p.upserts == [] and p.hard_deletes == []
    # written and deleted in this window: the whole row, deleted
    p = plan_soft_delete(meta(), [ch(1, Op.INSERT, after=r(2, 5)), ch(3, Op.DELETE, before=r(2, 6))])
    assert p.upserts == [{"id": 2, "v": 6, DELETED: True, DELETED_AT: commit_time(ts_of(3))}]
    p = plan_soft_delete(meta(), [ch(1, Op.UPDATE, r(3, 1), r(3, 2))])
    assert p.upserts == [{"id": 3, "v": 2, DELETED: False, DELETED_AT: None}]


def test_a_key_change_soft_deletes_the_old_key_and_a_reinsert_revives_it() -> None:
    p = plan_soft_delete(meta(), [ch(1, Op.UPDATE, r(1, 10), r(2, 10))])
    assert p.soft_deletes == [((1,), commit_time(ts_of(1)))] and p.hard_deletes == []
    assert p.upserts == [{"id": 2, "v": 10, DELETED: False, DELETED_AT: None}]
    p = plan_soft_delete(meta(), [ch(1, Op.INSERT, after=r(1, 9)), ch(2, Op.UPDATE, r(1, 9), r(2, 9))])
    assert sorted((u["id"], u[DELETED], u[DELETED_AT]) for u in p.upserts) == [
        (1, True, commit_time(ts_of(2))), (2, False, None)]
    p = plan_soft_delete(meta(), [ch(1, Op.DELETE, before=r(1, 1)), ch(2, Op.INSERT, after=r(1, 3))])
    assert p.hard_deletes == [(1,)] and p.upserts == [{"id": 1, "v": 3, DELETED: False, DELETED_AT: None}]


# ---- the target modelled in Python, against a reference from the change list ------------------------------------

def apply_history(target: dict, plan) -> None:
    """What the writers' SQL does: close each open version in a close's [prev, ts) interval, then insert each
    version unless key + _commit_ts is there."""
    for k, ts, prev, vf in plan.closes:
        for (tk, tts), row in target.items():
            if tk == k[0] and row[VALID_TO] is None and prev <= tts < ts:
                row[VALID_TO] = vf
    for v in plan.versions:
        target.setdefault((v["id"], v[COMMIT_TS]), {"v": None, **v})  # a column the version lacks: NULL


def apply_soft(target: dict, plan) -> None:
    for k in plan.hard_deletes:
        target.pop(k[0], None)
    for k, when in plan.soft_deletes:
        if k[0] in target:
            target[k[0]].update({DELETED: True, DELETED_AT: when})
    for row in plan.upserts:
        target.setdefault(row["id"], {}).update(row)  # an upsert sets the columns it carries


def stream(rng: random.Random, txns: int = 40) -> list[RowChange]:
    """Random transactions over a few keys: inserts, updates, key changes (as one UPDATE, or as TiCDC's delete +
    insert), deletes (some carrying only the key), re-inserts, key swaps; every key once per commit ts except a
    swap's, and every change a change of the row (TiDB sends no event for an update that changes nothing)."""
    live: dict[int, int] = {}
    out: list[RowChange] = []
    for n in range(1, txns + 1):
        touched: set[int] = set()
        group: list[RowChange] = []
        for _ in range(rng.randint(1, 3)):
            k = rng.randint(1, 6)
            if k in touched:
                continue
            v = rng.randint(0, 999)
            if k not in live:
                group.append(ch(n, Op.INSERT, after=r(k, v)))
                live[k] = v
                touched.add(k)
                continue
            kind = rng.random()
            free = [x for x in range(1, 9) if x not in live and x not in touched]
            if kind < 0.35:
                v = live[k] + rng.randint(1, 50)  # an update that changes nothing is no change upstream
                group.append(ch(n, Op.UPDATE, r(k, live[k]), r(k, v)))
                live[k] = v
                touched.add(k)
            elif kind < 0.55 and free:
                nk = rng.choice(free)
                if rng.random() < 0.5:
                    group.append(ch(n, Op.UPDATE, r(k, live[k]), r(nk, v)))
                else:
                    group += [ch(n, Op.DELETE, before=r(k, live[k])), ch(n, Op.INSERT, after=r(nk, v))]
                del live[k]
                live[nk] = v
                touched |= {k, nk}
            elif kind < 0.7:
                other = [x for x in live if x != k and x not in touched and live[x] != live[k]]
                if other:
                    o = rng.choice(other)
                    pair = [ch(n, Op.UPDATE, r(k, live[k]), r(o, live[k])),
                            ch(n, Op.UPDATE, r(o, live[o]), r(k, live[o]))]
                    group += pair[::rng.choice([1, -1])]
                    live[k], live[o] = live[o], live[k]
                    touched |= {k, o}
            else:
                group.append(ch(n, Op.DELETE, before=r(k, live[k]) if rng.random() < 0.7 else {"id": k}))
                del live[k]
                touched.add(k)
        out += group
    return out


def reference(changes: list[RowChange]) -> tuple[dict, dict]:
    """Versions and the soft-delete table from the state before and after each commit ts. A delete version holds
    the old row the stream sent: a key-only one leaves the other columns NULL."""
    key_only = {(c.before["id"], c.commit_ts) for c in changes if c.op is Op.DELETE and "v" not in c.before}
    state: dict[int, int] = {}
    hist: dict[tuple[int, int], dict] = {}
    soft: dict[int, dict] = {}
    by_key: dict[int, list[int]] = {}
    for ts in sorted({c.commit_ts for c in changes}):
        before = dict(state)
        group = [c for c in changes if c.commit_ts == ts]
        for c in group:
            if c.op is not Op.INSERT:
                state.pop(c.before["id"], None)
        for c in group:
            if c.op is not Op.DELETE:
                state[c.after["id"]] = c.after["v"]
        when = commit_time(ts)
        for k in set(before) | set(state):
            b, a = before.get(k), state.get(k)
            if b == a:
                continue
            op = "delete" if a is None else "insert" if b is None else "update"
            shown = None if (k, ts) in key_only else b
            hist[(k, ts)] = {"id": k, "v": shown if a is None else a, COMMIT_TS: ts, OP: op, VALID_FROM: when,
                             VALID_TO: None}
            by_key.setdefault(k, []).append(ts)
            soft[k] = ({"id": k, "v": b, DELETED: True, DELETED_AT: when} if a is None
                       else {"id": k, "v": a, DELETED: False, DELETED_AT: None})
    for k, tss in by_key.items():
        for a, b in zip(tss, tss[1:]):
            hist[(k, a)][VALID_TO] = commit_time(b)
    return hist, soft


def windows(changes: list[RowChange], rng: random.Random) -> list[list[RowChange]]:
    """The stream cut at random commit-ts boundaries (a window never splits a commit ts: the gate releases whole
    transactions)."""
    tss = sorted({c.commit_ts for c in changes})
    cuts = sorted(rng.sample(tss, k=min(len(tss), rng.randint(0, 6))))
    out, cur, j = [], [], 0
    for c in changes:
        while j < len(cuts) and c.commit_ts > cuts[j]:
            j += 1
            if cur:
                out.append(cur)
                cur = []
        cur.append(c)
    return out + [cur] if cur else out


def run_windows(target_h: dict, target_s: dict, wins: list[list[RowChange]], m) -> None:
    for w in wins:
        apply_history(target_h, plan_history(m, ("id",), w))
        apply_soft(target_s, plan_soft_delete(m, w))


@pytest.mark.parametrize("seed", range(60))
def test_the_target_is_the_reference_whatever_the_windows_and_replays(seed: int) -> None:
    rng = random.Random(seed)
    m = meta()
    changes = stream(rng)
    hist, soft = reference(changes)
    h: dict = {}
    s: dict = {}
    run_windows(h, s, windows(changes, rng), m)
    assert h == hist
    # soft delete: a row deleted by a key-only delete keeps the values it had (the target's own)
    assert s == soft
    # a replay from the start (a new pipeline), cut differently, changes nothing
    run_windows(h, s, windows(changes, rng), m)
    assert h == hist and s == soft
    # a target that holds the stream up to some commit ts, then a replay of all of it: windows straddle it
    tss = sorted({c.commit_ts for c in changes})
    upto = rng.choice(tss)
    h2: dict = {}
    s2: dict = {}
    run_windows(h2, s2, windows([c for c in changes if c.commit_ts <= upto], rng), m)
    run_windows(h2, s2, windows(changes, rng), m)
    assert h2 == hist and s2 == soft


# ---- what a table needs for a mode, and the DDL that gives it ----------------------------------------------------

SHOP = TableShape("shop", "customers", ("id", "email", "name"), frozenset({"id", "email"}), ("id",), "customers_pkey",
                  (UniqueIndex("uk_email", ("email",), prefixes=(None,)),))


def test_conform_a_fresh_table_for_history_and_soft_delete() -> None:
    c = conform("history", SHOP)
    assert [x.name for x in c.add] == ["_commit_ts", "_op", "_valid_from", "_valid_to"]
    assert c.primary_key == ("id", "_commit_ts") and [u.name for u in c.demote] == ["uk_email"]
    assert c.upstream_key == ("id",) and c
    s = conform("soft_delete", SHOP)
    assert [x.name for x in s.add] == ["_deleted", "_deleted_at"] and s.primary_key is None
    assert [u.name for u in s.demote] == ["uk_email"]
    done = TableShape("shop", "customers", SHOP.columns + tuple(c.name for c in mode_columns("history")),
                      SHOP.not_null, ("id", "_commit_ts"))
    assert not conform("history", done) and conform("history", done).upstream_key == ("id",)
    # the stream says the upstream key is another: the target's key must follow it
    assert conform("history", done, ("email",)).primary_key == ("email", "_commit_ts")
    assert not conform("replica", SHOP)


def test_a_soft_delete_table_keyed_by_a_not_null_unique_key_keeps_it() -> None:
    shape = TableShape("s", "t", ("code", "n"), frozenset({"code"}), (), None,
                       (UniqueIndex("uq_code", ("code",)), UniqueIndex("uq_n", ("n",))))
    c = conform("soft_delete", shape)
    assert c.upstream_key == ("code",) and [u.name for u in c.demote] == ["uq_n"]
    h = conform("history", shape)
    assert h.primary_key == ("code", "_commit_ts") and [u.name for u in h.demote] == ["uq_code", "uq_n"]


def test_a_keyless_table_cannot_use_a_mode() -> None:
    shape = TableShape("s", "t", ("a", "b"), frozenset(), (), None, (UniqueIndex("u", ("a",)),))  # a is nullable
    for mode in ("history", "soft_delete"):
        with pytest.raises(ModeError, match=f"no primary key .* route mode {mode}.*mode = \"replica\""):
            conform(mode, shape)


def test_the_mode_ddl_is_rendered_with_quoted_identifiers() -> None:
    shape = TableShape("sh`op", "cu\"st", ("id", "e`mail", "txt"), frozenset({"id"}), ("id",), "cu\"st_pkey",
                       (UniqueIndex("uk`e", ("e`mail", "txt"), prefixes=(None, 10)),))
    my = MYSQL.mode_statements(sa_mysql.dialect().identifier_preparer, shape, conform("history", shape))
    assert my == ["ALTER TABLE `sh``op`.`cu\"st` ADD COLUMN `_commit_ts` BIGINT UNSIGNED NOT NULL, ADD COLUMN `_op` "
                  "VARCHAR(6) NOT NULL, ADD COLUMN `_valid_from` DATETIME(6) NOT NULL, ADD COLUMN `_valid_to` "
                  "DATETIME(6) NULL, DROP PRIMARY KEY, ADD PRIMARY KEY (`id`, `_commit_ts`), DROP INDEX `uk``e`, "
                  "ADD INDEX `uk``e` (`e``mail`, `txt`(10))"]
    pg_shape = TableShape("sh\"op", "t", ("id", "e"), frozenset({"id"}), ("id",), "t_pkey",
                          (UniqueIndex("t__u", ("e",)), UniqueIndex("uc", ("e",), constraint=True)))
    pg = POSTGRES.mode_statements(sa_pg.dialect().identifier_preparer, pg_shape, conform("soft_delete", pg_shape))
    assert pg == ['ALTER TABLE "sh""op"."t" ADD COLUMN "_deleted" boolean NOT NULL DEFAULT false, ADD COLUMN '
                  '"_deleted_at" timestamp(6) without time zone, DROP CONSTRAINT "uc"',
                  'DROP INDEX "sh""op"."t__u"', 'CREATE INDEX "t__u" ON "sh""op"."t" ("e")',
                  'CREATE INDEX "uc" ON "sh""op"."t" ("e")']
    pk = POSTGRES.mode_statements(sa_pg.dialect().identifier_preparer, pg_shape,
                                  Conform("history", ("id",), primary_key=("id", "_commit_ts")))
    assert pk == ['ALTER TABLE "sh""op"."t" DROP CONSTRAINT "t_pkey", ADD CONSTRAINT "t_pkey" PRIMARY KEY ("id", '
                  '"_commit_ts")']
    assert MYSQL.mode_statements(sa_mysql.dialect().identifier_preparer, shape, Conform("history", ("id",))) == []


def test_verify_compares_the_current_rows_of_a_moded_table() -> None:
    from applier.verify.tables import current_rows_filter

    q = sa_pg.dialect().identifier_preparer.quote_identifier
    assert current_rows_filter("history", q) == '"_valid_to" IS NULL AND "_op" <> \'delete\''
    assert current_rows_filter("soft_delete", q) == 'NOT "_deleted"'
    assert current_rows_filter("replica", q) == ""


# ---- configuration and routing ---------------------------------------------------------------------------------

def config(**route) -> dict:
    return {"pipeline": {"name": "p", "checkpoint_dir": "/tmp/p"},
            "source": {"bootstrap_servers": "127.0.0.1:9092", "topics": ["t"], "protocol": "open"},
            "target": {"url": "mysql+pymysql://u@127.0.0.1/d"},
            "route": [{"match": "shop.*", "schema": "copy"}, {"match": "shop.h*", **route}]}


def config_error(data: dict) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(data, env={})
    return info.value


def test_a_route_sets_the_mode_of_the_tables_it_decides() -> None:
    s = parse_config(config(mode="history"), env={})
    r = router_for(s)
    assert r.write_mode("shop", "hist") == "history" and r.write_mode("shop", "orders") == "replica"
    assert r.write_mode("other", "h") == "replica"
    assert r.write_mode("shop", "") == "history"  # a schema-level DDL reaches the moded tables
    assert s.redacted()["route"][1] == {"match": "shop.h*", "mode": "history"}
    assert router_for(parse_config(config(mode="soft_delete"), env={})).write_mode("shop", "h") == "soft_delete"
    # the last matching rule decides, as for the route itself
    rules = Router([Rule("shop.*", mode="history"), Rule("shop.x", schema="y")])
    assert rules.write_mode("shop", "x") == "replica" and rules.write_mode("shop", "z") == "history"


def test_a_bad_mode_is_a_config_error_naming_the_key() -> None:
    err = config_error(config(mode="scd2"))
    assert err.key == "route[1].mode" and "replica, history, soft_delete" in str(err)
    assert config_error(config(mode=1)).key == "route[1].mode"
    with pytest.raises(RuleError, match="ignores what it matches"):
        Rule("shop.*", ignore=True, mode="history")


def test_a_mode_needs_a_gated_stream_and_no_quarantine() -> None:
    data = config(mode="history")
    data["source"].update(protocol="canal-json", codec={"require_tidb_extension": False})
    assert "needs a gated changefeed" in str(config_error(data)) and config_error(data).key == "route[1].mode"
    data = config(mode="soft_delete", on_apply_error="quarantine")
    assert 'on_apply_error = "quarantine" (route[1].on_apply_error)' in str(config_error(data))
    data = config(mode="history")
    data["target"]["on_apply_error"] = "skip"
    assert "target.on_apply_error" in str(config_error(data))
    data["target"]["on_apply_error"] = "skip"
    data["route"][1]["on_apply_error"] = "stop"  # the rule's own policy decides for its tables
    parse_config(data, env={})
    data["pipeline"]["on_decode_error"] = "quarantine"
    assert 'on_decode_error = "quarantine"' in str(config_error(data))
    data["pipeline"]["on_decode_error"] = "skip"
    parse_config(data, env={})


def test_validate_exits_2_on_a_bad_mode(tmp_path, capsys) -> None:
    from applier.cli import main
    from tests.e2e.helpers import write_toml

    path = write_toml(tmp_path / "c.toml", config(mode="versions"))
    assert main(["validate", "-c", str(path)]) == 2
    assert "route[1].mode" in capsys.readouterr().err


# ---- DDL a moded route refuses ---------------------------------------------------------------------------------

def refusal(query: str, mode: str, table: str = "t") -> str | None:
    """What _refuse_for_mode says of the DDL (None: it runs)."""
    from applier.apply import Applier

    tr = translate("mariadb", query, schema="shop", table=table, route=lambda s, t: (s, t))
    fake = SimpleNamespace(write_mode=lambda s, t: mode if t in ("t", "") else "replica",
                           dialect=SimpleNamespace(name="mariadb"))
    ev = SimpleNamespace(query=query, schema="shop", table=table)
    try:
        Applier._refuse_for_mode(fake, ev, tr)  # type: ignore[arg-type]
    except UnsupportedDDL as exc:
        return exc.reason
    return None


@pytest.mark.parametrize("mode", ["history", "soft_delete"])
def test_ddl_that_would_destroy_what_a_mode_keeps_is_unsupported(mode: str) -> None:
    assert "would drop table shop.t" in refusal("DROP TABLE t", mode)
    assert "would empty table shop.t" in refusal("TRUNCATE TABLE t", mode)
    assert "would drop schema 'shop'" in refusal("DROP DATABASE shop", mode)
    assert "partitioning" in refusal("ALTER TABLE t TRUNCATE PARTITION p0", mode)
    assert "different modes" in refusal("RENAME TABLE t TO u", mode, table="u")
    assert refusal("ALTER TABLE t ADD COLUMN c INT", mode) is None
    assert refusal("CREATE TABLE t (id INT PRIMARY KEY)", mode) is None
    assert refusal("TRUNCATE TABLE t", "replica") is None and refusal("DROP TABLE x", mode, table="x") is None


def test_a_primary_key_change_of_a_history_table_is_unsupported() -> None:
    assert "primary key" in refusal("ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)", "history")
    assert refusal("ALTER TABLE t DROP PRIMARY KEY, ADD PRIMARY KEY (id, v)", "soft_delete") is None


class _Sink:
    """A writer that refuses nothing and holds a replica-shaped table ``t`` (id, v)."""

    def __init__(self) -> None:
        self.log: list[tuple] = []

    def begin(self, conn) -> None:
        pass

    def table(self, conn, schema: str, name: str):
        return build_meta(schema, name, [("id", False, False), ("v", True, False)], ("id",), [])

    def reflect(self, conn, schema: str, name: str):
        return self.table(conn, schema, name)

    def mode_shape(self, conn, schema: str, name: str) -> TableShape:
        return TableShape(schema, name, ("id", "v"), frozenset({"id"}), ("id",))

    def write(self, conn, plan) -> None:  # pragma: no cover - a moded table is never written as a replica
        self.log.append(("write", plan))

    def forget_tables(self, targets) -> None:
        pass

    def own_schema(self, conn) -> str:
        return "applier_home"


class _Dialect(type(MYSQL)):  # MySQL's translation and mode DDL, this writer
    def __init__(self, sink: _Sink) -> None:
        self.sink = sink

    def writer(self, batch_rows: int = 5000, timer=None) -> _Sink:  # type: ignore[override]
        return self.sink


class _Store:
    pipeline = "p"

    def __init__(self, log: list) -> None:
        self.log = log

    def save(self, conn, **kw) -> None:
        self.log.append(("save", kw["applied_ts"]))

    def ddl_state(self, conn, key: str) -> None:
        return None

    def source_tables(self, conn) -> list:
        return []

    def ddl_record(self, conn, ev, key: str, *, state: str, statements: list[str], detail: str = "") -> None:
        self.log.append(("ddl", state, detail))


def applier(write_mode, **kw):
    from sqlalchemy import create_engine

    from applier.apply import Applier
    from applier.gate import Gate
    from applier.progress import metadata

    engine = create_engine("sqlite://")
    metadata.create_all(engine)
    sink = _Sink()
    ap = Applier(engine, _Dialect(sink), lambda s, t: ("main", t), _Store(sink.log), write_mode=write_mode, **kw)
    return ap, Gate(partitions=[("k", 0)], applied_ts=0, partition_resolved={}), sink


def test_a_refused_ddl_stops_or_is_recorded_as_skipped_by_policy() -> None:
    from applier.events import DDL

    for policy in ("stop", "skip"):
        ap, gate, sink = applier(lambda s, t: "history", on_unsupported_ddl=policy)
        gate.add([DDL("s", "t", 20, "TRUNCATE TABLE t", SourcePosition("k", 0, 0)),
                  Resolved(20, SourcePosition("k", 0, 1))])
        if policy == "stop":
            with pytest.raises(ApplyError, match='would empty table s.t, routed with mode = "history"'):
                ap.apply(gate.release())
            assert not [e for e in sink.log if e[0] == "ddl"]
        else:
            ap.apply(gate.release())
            assert [e[:2] for e in sink.log if e[0] == "ddl"] == [("ddl", "skipped")]
            assert ap.total.ddls_skipped == 1


def test_a_table_not_ready_for_its_mode_stops_with_the_statements_to_run() -> None:
    ap, gate, _ = applier(lambda s, t: "history")
    gate.add([RowChange("s", "t", 10, Op.INSERT, None, {"id": 1, "v": 1}, COLS, SourcePosition("k", 0, 0)),
              Resolved(10, SourcePosition("k", 0, 1))])
    with pytest.raises(ApplyError) as info:
        ap.apply(gate.release())
    msg = str(info.value)
    assert "target table main.t is routed with mode = \"history\"" in msg
    assert "column(s) _commit_ts, _op, _valid_from, _valid_to; primary key (id, _commit_ts)" in msg
    assert 'Run on the target: ALTER TABLE "main"."t" ADD COLUMN "_commit_ts" BIGINT UNSIGNED NOT NULL' in msg
    assert "upstream table s.t, first change at topic=k partition=0 offset=0" in msg
