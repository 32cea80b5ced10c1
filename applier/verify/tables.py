"""Which tables are compared, and how: the upstream tables through the config's routes, each one's key, and its
columns matched with the replica's (names, kinds, each side's type).

Why: verify compares one upstream table with one replica table by key (the primary key, else a unique key over
NOT NULL columns), over the columns both have; a column only one side has, or a missing replica table, is a
schema difference. The upstream is read through its ``information_schema``, the replica through the target
writer's own reflection.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from applier.modes import DELETED, HISTORY, OP, OP_DELETE, SOFT_DELETE, VALID_TO, mode_columns
from applier.routing import Router, is_system_schema
from applier.sinks.table import ApplyError, shown
from applier.verify.checksums import MYSQL_FAMILY, SERVER_CHECKSUM_KINDS
from applier.verify.normalise import base_type, column_kind
from applier.verify.results import TableResult
from applier.verify.snapshot import Side


@dataclass(frozen=True)
class ColumnPlan:
    """One compared column: its name upstream and in the replica, its kind and each side's catalog type."""

    name: str
    target_name: str
    kind: str
    up_type: str
    down_type: str
    up_collation: str | None = None


@dataclass(frozen=True)
class TablePlan:
    """One upstream table and its replica table. ``columns`` start with the key columns (``key_len`` of them:
    the upstream's primary key, else a unique key over NOT NULL columns)."""

    upstream: tuple[str, str]
    target: tuple[str, str]
    columns: tuple[ColumnPlan, ...]
    key_len: int
    target_key: tuple[str, ...] = ()  # the replica's own key (the fix-up SQL's ON CONFLICT)
    target_types: Mapping[str, str] = field(default_factory=dict)  # replica column -> type, for the converters
    collapse_zero_dates: bool = False
    # route modes history / soft_delete (applier.modes): the replica keeps more rows than upstream has, and only
    # those this condition selects (SQL over the replica's quoted names) are the upstream table's current state
    mode: str = "replica"
    target_filter: str = ""

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(c.kind for c in self.columns)

    @property
    def key_columns(self) -> tuple[ColumnPlan, ...]:
        return self.columns[: self.key_len]

    def server_checksums(self, up_flavour: str, down_flavour: str) -> bool:
        return (up_flavour in MYSQL_FAMILY and down_flavour in MYSQL_FAMILY
                and all(c.kind in SERVER_CHECKSUM_KINDS for c in self.columns))


@dataclass(frozen=True)
class UpstreamColumn:
    name: str
    data_type: str
    column_type: str
    nullable: bool
    collation: str | None
    generated: bool


def upstream_tables(side: Side) -> list[tuple[str, str]]:
    return [(s, t) for s, t in side.rows(
        "SELECT TABLE_SCHEMA, TABLE_NAME FROM information_schema.TABLES WHERE TABLE_TYPE = 'BASE TABLE' "
        "ORDER BY TABLE_SCHEMA, TABLE_NAME") if not is_system_schema(s)]


def routed_tables(tables: Iterable[tuple[str, str]], router: Router) -> tuple[
        list[tuple[tuple[str, str], tuple[str, str]]], dict[tuple[str, str], list[tuple[str, str]]]]:
    """(upstream, target) pairs of the routed tables, and the targets several upstream tables merge into."""
    pairs = []
    by_target: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for s, t in tables:
        dest = router.route(s, t)
        if dest is None:
            continue
        pairs.append(((s, t), dest))
        by_target.setdefault(dest, []).append((s, t))
    merged = {k: v for k, v in by_target.items() if len(v) > 1}
    return pairs, merged


def upstream_columns(side: Side, schema: str, table: str) -> list[UpstreamColumn]:
    rows = side.rows(
        "SELECT COLUMN_NAME, DATA_TYPE, COLUMN_TYPE, IS_NULLABLE, COLLATION_NAME, EXTRA "
        "FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = :s AND TABLE_NAME = :t ORDER BY ORDINAL_POSITION",
        {"s": schema, "t": table})
    return [UpstreamColumn(str(n), str(dt), str(ct), nl == "YES", coll, "GENERATED" in str(extra or "").upper())
            for n, dt, ct, nl, coll, extra in rows]


def upstream_key(side: Side, schema: str, table: str, columns: Sequence[UpstreamColumn]) -> tuple[str, ...]:
    """The primary key, else the first (by name) unique key whose columns are all NOT NULL."""
    idx: dict[str, list[str]] = {}
    for name, col in side.rows(
            "SELECT INDEX_NAME, COLUMN_NAME FROM information_schema.STATISTICS WHERE TABLE_SCHEMA = :s AND "
            "TABLE_NAME = :t AND NON_UNIQUE = 0 ORDER BY INDEX_NAME, SEQ_IN_INDEX", {"s": schema, "t": table}):
        if col is not None:
            idx.setdefault(str(name), []).append(str(col))
    if "PRIMARY" in idx:
        return tuple(idx["PRIMARY"])
    nullable = {c.name: c.nullable for c in columns}
    for name in sorted(idx):
        if all(not nullable.get(c, True) for c in idx[name]):
            return tuple(idx[name])
    return ()


def plan_table(up: Side, down: Side, upstream: tuple[str, str], target: tuple[str, str], writer: Any,
               result: TableResult, mode: str = "replica") -> TablePlan | None:
    """Match the two tables' columns; None (with ``result.skipped`` or ``schema_problems`` set) when the table
    cannot be compared. ``mode``: the route's mode; for history and soft_delete only the replica's current rows
    (:func:`current_rows_filter`) are compared, over the upstream's columns (the mode's own columns are not)."""
    cols = [c for c in upstream_columns(up, *upstream) if not c.generated]
    key = upstream_key(up, *upstream, cols)
    if not key:
        result.skipped = ("no primary key or unique key over NOT NULL columns upstream (verify compares by key; "
                          "compare this table by hand)")
        return None
    try:
        meta = writer.reflect(down.conn, target[0], target[1])
    except ApplyError:
        result.schema_problems.append(f"table {shown(*target)} does not exist in the replica")
        result.rows_upstream = int(up.rows(f"SELECT COUNT(*) FROM {up.table(*upstream)}")[0][0])
        return None
    by_name = {c: c for c in meta.columns}
    by_lower = {c.lower(): c for c in meta.columns}
    matched: dict[str, str] = {}
    for c in cols:
        t = by_name.get(c.name) or by_lower.get(c.name.lower())
        if t is None:
            result.schema_problems.append(f"column {shown(c.name)} is missing in the replica")
        else:
            matched[c.name] = t
    used = set(matched.values())
    upstream_names = {c.name.lower() for c in cols}
    own = {c.name for c in mode_columns(mode)}
    for t in meta.columns:
        if t not in used and t.lower() not in upstream_names and t not in own:
            result.schema_problems.append(f"column {shown(t)} is only in the replica")
    missing_key = [k for k in key if k not in matched]
    if missing_key:
        result.schema_problems.append(f"key column(s) {', '.join(map(shown, missing_key))} missing in the replica")
        return None
    by_col = {c.name: c for c in cols}
    order = list(key) + [c.name for c in cols if c.name not in key and c.name in matched]
    plans = tuple(_column_plan(by_col[n], matched[n], meta.types.get(matched[n], "")
                               or _catalog_type(down, target, matched[n])) for n in order)
    missing_own = [c for c in own if c not in meta.columns]
    if missing_own:
        result.schema_problems.append(f"route mode {mode}: column(s) {', '.join(map(shown, sorted(missing_own)))} "
                                      "missing in the replica")
        return None
    return TablePlan(upstream, target, plans, len(key), target_key=tuple(meta.key), target_types=dict(meta.types),
                     collapse_zero_dates=down.flavour == "postgresql", mode=mode,
                     target_filter=current_rows_filter(mode, down.q))


def current_rows_filter(mode: str, q: Callable[[str], str]) -> str:
    """The replica rows that are the upstream table's current state in a route mode, as a SQL condition over the
    names ``q`` quotes ("" for replica: every row): history, each key's open version unless it is a delete;
    soft delete, the rows not deleted."""
    if mode == HISTORY:
        return f"{q(VALID_TO)} IS NULL AND {q(OP)} <> '{OP_DELETE}'"
    if mode == SOFT_DELETE:
        return f"NOT {q(DELETED)}"
    return ""


def _column_plan(up: UpstreamColumn, target_name: str, down_type: str) -> ColumnPlan:
    """The kind comes from the upstream type, except that a JSON column on either side is compared as JSON
    (MariaDB's JSON is LONGTEXT in its catalog; the PostgreSQL replica's jsonb normalises the text)."""
    kind = column_kind(up.data_type)
    if base_type(down_type) in ("json", "jsonb"):
        kind = "json"
    return ColumnPlan(up.name, target_name, kind, up.column_type, down_type, up.collation)


def _catalog_type(side: Side, target: tuple[str, str], column: str) -> str:
    """A replica column's type where the writer's reflection did not give one."""
    if side.flavour == "postgresql":
        return ""
    rows = side.rows("SELECT COLUMN_TYPE FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = COALESCE(:s, "
                     "DATABASE()) AND TABLE_NAME = :t AND COLUMN_NAME = :c",
                     {"s": target[0] or None, "t": target[1], "c": column})
    return str(rows[0][0]) if rows else ""
