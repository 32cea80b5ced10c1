"""``applier validate --target``: the shard merges a pipeline has made, and whether their keys can hold them.

When ``[[route]]`` rules send several upstream tables (shards) into one target table, the target has one key and
the writer upserts and deletes by it. Two shards' rows with equal values of that key are one row downstream: the
later one overwrites the earlier, silently, and ``applier verify`` cannot see it (it does not compare merged
tables). The upstream cannot warn either, each shard's key being unique on its own. So this report reads what the
target knows: the shards (``applier_tables`` rows of the pipeline, grouped by where the *current* routes send
them), each shard's primary key from its last replicated ``CREATE TABLE`` (and the ALTERs after it that change
the key), parsed with the translators' MySQL grammar, and the target table's key from the catalog.

Findings: ``problem`` when the shards' keys differ from each other or from the target's (rows distinct in a shard
can collide in the target, or the target's key is not what the shards' changes are keyed by); ``warning`` when
they share one key, which is only safe if the shards' key values never overlap. The grouping and comparison are
pure functions (:func:`merged_targets`, :func:`shard_key`, :func:`findings_for`); :func:`gather` does the reads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence

from sqlalchemy import select
from sqlalchemy.engine import Connection, Engine

from applier.ddl.lexer import Cursor, LexError, Statement
from applier.ddl.syntax import column_list as create_table_elements
from applier.ddl.syntax import alter_specs, parse_column, parse_index_def, starts_index
from applier.ddl.tidb import neutralise_tidb
from applier.progress import ddl_history, tables
from applier.sinks.table import shown

Route = Callable[[str, str], "tuple[str, str] | None"]
Reflect = Callable[[Connection, str, str], Any]  # -> TableMeta (.key)

PROBLEM = "problem"
WARNING = "warning"


@dataclass(frozen=True)
class KnownKey:
    """A primary key as far as it is known: ``columns`` None when it is not (``why`` says why), () for a table
    without one."""

    columns: tuple[str, ...] | None
    why: str = ""

    @property
    def known(self) -> bool:
        return self.columns is not None

    def shown(self) -> str:
        if self.columns is None:
            return f"unknown: {self.why}"
        return f"({', '.join(self.columns)})" if self.columns else "none"


@dataclass(frozen=True)
class Shard:
    schema: str
    table: str
    key: KnownKey

    @property
    def name(self) -> str:
        return shown(self.schema, self.table)


@dataclass(frozen=True)
class Finding:
    level: str  # PROBLEM | WARNING
    message: str


@dataclass
class MergedTarget:
    """One target table that two or more upstream tables route into."""

    schema: str
    table: str
    shards: list[Shard]
    key: KnownKey  # the target table's
    findings: list[Finding] = field(default_factory=list)

    @property
    def name(self) -> str:
        return shown(self.schema, self.table)

    def as_json(self) -> dict[str, Any]:
        return {
            "target": self.name,
            "target_key": None if self.key.columns is None else list(self.key.columns),
            "target_key_unknown": self.key.why or None,
            "shards": [{"table": s.name, "primary_key": None if s.key.columns is None else list(s.key.columns),
                        "unknown": s.key.why or None} for s in self.shards],
            "findings": [{"level": f.level, "message": f.message} for f in self.findings],
        }


@dataclass
class ShardReport:
    pipeline: str
    target: str  # the target's URL, password masked
    merges: list[MergedTarget]
    note: str = ""  # why nothing could be looked at (no applier tables yet)

    @property
    def problems(self) -> int:
        return sum(f.level == PROBLEM for m in self.merges for f in m.findings)

    @property
    def warnings(self) -> int:
        return sum(f.level == WARNING for m in self.merges for f in m.findings)

    def as_json(self) -> dict[str, Any]:
        return {"pipeline": self.pipeline, "target": self.target, "note": self.note or None,
                "merges": [m.as_json() for m in self.merges], "problems": self.problems, "warnings": self.warnings}


# ---------------------------------------------------------------------------------------------------------
# Pure: grouping, keys from DDL text, comparison


def merged_targets(sources: Iterable[tuple[str, str]], route: Route) -> dict[tuple[str, str], list[tuple[str, str]]]:
    """Upstream tables grouped by the target the current routes send them to, only targets with two or more
    (sorted, for a stable report). An upstream table the routes now ignore is in no group: its rows stay in the
    target but nothing more merges with them."""
    by_target: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for schema, table in dict.fromkeys(sources):
        to = route(schema, table)
        if to is not None:
            by_target.setdefault((to[0], to[1]), []).append((schema, table))
    return {t: sorted(s) for t, s in sorted(by_target.items()) if len(s) > 1}


def _statement(query: str) -> Cursor:
    return Cursor(Statement.lex(neutralise_tidb(query)).sig)


def ddl_verb(query: str) -> str:
    """"create_table", "alter_table" or "" for any other statement (or one that does not lex)."""
    try:
        c = _statement(query)
    except LexError:
        return ""
    if c.accept_kw("CREATE"):
        return "create_table" if c.is_kw("TABLE") else ""
    if c.accept_kw("ALTER"):
        c.accept_kw("ONLINE", "OFFLINE", "IGNORE")
        return "alter_table" if c.is_kw("TABLE") else ""
    return ""


def _skip_table_name(c: Cursor) -> None:
    c.ident()
    if c.is_op(".") and c.peek(1) is not None and c.peek(1).is_ident:
        c.next()
        c.ident()


def create_table_key(query: str) -> KnownKey:
    """The primary key a MySQL ``CREATE TABLE`` declares (inline or table-level), read with the grammar the
    PostgreSQL translator renders tables from, so both agree on what the key is."""
    try:
        c = _statement(query)
        c.expect_kw("CREATE")
        c.expect_kw("TABLE")
        c.accept_seq("IF", "NOT", "EXISTS")
        _skip_table_name(c)
        if c.is_kw("LIKE") or (c.is_op("(") and c.is_kw("LIKE", k=1)):
            return KnownKey(None, "its CREATE TABLE copies another table (LIKE)")
        _columns, indexes = create_table_elements(c)
    except LexError as exc:
        return KnownKey(None, f"its CREATE TABLE could not be read ({exc})")
    pk = next((i for i in indexes if i.kind == "primary"), None)
    if pk is None:
        return KnownKey(())
    if pk.has_expression:
        return KnownKey(None, "its primary key has an expression part")
    return KnownKey(tuple(p.column for p in pk.parts if p.column))


def _fold(names: Iterable[str]) -> tuple[str, ...]:
    return tuple(n.casefold() for n in names)


def after_alter(key: KnownKey, query: str) -> KnownKey:
    """``key`` after an ``ALTER TABLE``: DROP PRIMARY KEY, ADD PRIMARY KEY (table-level or on a column),
    a renamed or dropped key column. Other clauses leave the key as it is; an ALTER this cannot read makes it
    unknown only when it may touch the key."""
    if key.columns is None:
        return key
    cols = list(key.columns)
    try:
        c = _statement(query)
        c.expect_kw("ALTER")
        c.accept_kw("ONLINE", "OFFLINE", "IGNORE")
        c.expect_kw("TABLE")
        _skip_table_name(c)
        for lo, hi in alter_specs(c.toks, c.pos, c.end):
            s = Cursor(c.toks, lo, hi)
            if s.accept_kw("DROP"):
                if s.accept_seq("PRIMARY", "KEY"):
                    cols = []
                elif s.accept_kw("INDEX", "KEY", "CONSTRAINT"):
                    s.accept_seq("IF", "EXISTS")
                    if s.ident().ident.upper() == "PRIMARY":
                        cols = []
                elif not s.is_kw("FOREIGN", "CHECK", "PARTITION"):
                    s.accept_kw("COLUMN")
                    s.accept_seq("IF", "EXISTS")
                    gone = s.ident().ident.casefold()
                    cols = [k for k in cols if k.casefold() != gone]  # MySQL drops it from the key too
            elif s.accept_kw("ADD"):
                if not s.accept_kw("COLUMN") and starts_index(s):
                    idx = parse_index_def(s)
                    if idx.kind == "primary":
                        if idx.has_expression:
                            return KnownKey(None, "an ALTER gave it a primary key with an expression part")
                        cols = [p.column for p in idx.parts if p.column]
                else:
                    s.accept_seq("IF", "NOT", "EXISTS")
                    if not s.is_op("("):
                        col = parse_column(s)
                        if col.primary:
                            cols = [col.name]
            elif s.accept_kw("CHANGE", "MODIFY"):
                change = s.toks[lo].is_word("CHANGE")
                s.accept_kw("COLUMN")
                s.accept_seq("IF", "EXISTS")
                old = s.ident().ident if change else None
                col = parse_column(s)
                old = old or col.name
                cols = [col.name if k.casefold() == old.casefold() else k for k in cols]
                if col.primary:
                    cols = [col.name]
            elif s.accept_seq("RENAME", "COLUMN"):
                old = s.ident().ident
                s.expect_kw("TO")
                new = s.ident().ident
                cols = [new if k.casefold() == old.casefold() else k for k in cols]
    except LexError as exc:
        return KnownKey(None, f"an ALTER TABLE after its CREATE TABLE could not be read ({exc})")
    return KnownKey(tuple(cols))


def shard_key(history: Sequence[str]) -> KnownKey:
    """A shard's primary key from its applied DDL queries (oldest first): the last CREATE TABLE, then the ALTERs
    after it."""
    last = max((i for i, q in enumerate(history) if ddl_verb(q) == "create_table"), default=None)
    if last is None:
        return KnownKey(None, "its CREATE TABLE was not replicated")
    key = create_table_key(history[last])
    for q in history[last + 1:]:
        if ddl_verb(q) == "alter_table":
            key = after_alter(key, q)
    return key


def _cols(cols: Sequence[str]) -> str:
    return f"({', '.join(cols)})" if cols else "no primary key"


def findings_for(m: MergedTarget) -> list[Finding]:
    """(a) a problem when the known keys of the shards differ from each other or from the target's; (b) else a
    warning that one shared key cannot tell the shards apart. Keys are compared as column sets (the order of a
    key's columns does not change which rows it makes equal), case-insensitively as MySQL names are."""
    out: list[Finding] = []
    known = [s for s in m.shards if s.key.columns is not None]
    groups: dict[frozenset[str], list[Shard]] = {}
    for s in known:
        groups.setdefault(frozenset(_fold(s.key.columns or ())), []).append(s)
    if len(groups) > 1:
        parts = "; ".join(f"{', '.join(s.name for s in ss)}: {_cols(ss[0].key.columns or ())}"
                          for ss in groups.values())
        out.append(Finding(PROBLEM, f"the shards merged into {m.name} have different primary keys ({parts}). "
                           f"The target has one key, so rows that one shard keeps apart can overwrite each other "
                           f"there. Give the shards the same key upstream, or route them to separate tables"))
    tkey = m.key.columns
    if tkey is not None:
        tset = frozenset(_fold(tkey))
        for kset, ss in groups.items():
            if kset == tset:
                continue
            names = ", ".join(s.name for s in ss)
            lost = sorted(c for c in (ss[0].key.columns or ()) if c.casefold() not in tset)
            why = (f"rows of {names} that differ only in {', '.join(lost)} overwrite each other there" if lost
                   and tset <= kset and tset else "the writer updates and deletes by the target's key, which is "
                   "not what these shards' changes are keyed by")
            out.append(Finding(PROBLEM, f"target {m.name} has primary key {_cols(tkey)}, but {names} has "
                               f"{_cols(ss[0].key.columns or ())}: {why}. Make the target's key "
                               f"{_cols(ss[0].key.columns or ())} (or the shards' keys {_cols(tkey)})"))
    if out:
        return out
    shared = tkey if tkey is not None else (known[0].key.columns if known else None)
    if shared is None:
        out.append(Finding(WARNING, f"neither the target's key nor any shard's is known, so {m.name} could not be "
                           "checked: " + (m.key.why or "")))
    elif not shared:
        out.append(Finding(WARNING, f"{m.name} has no primary key (and no unique key over NOT NULL columns): its "
                           f"{len(m.shards)} shards' rows are matched by their whole old row (README, \"Keyless "
                           "tables\"), so an update or delete in one shard may change an identical row that came "
                           "from another; replays of keyless tables are at-least-once"))
    else:
        out.append(Finding(WARNING, f"all {len(m.shards)} shards merged into {m.name} share primary key "
                           f"{_cols(shared)}, and no column of it tells the shards apart: a row with the same "
                           f"{_cols(shared)} in two shards is ONE row in the target, the later change overwrites "
                           "the other shard's row (and a delete in one shard deletes it for all). This is safe only "
                           "if the shards' key values never overlap (e.g. auto-increment offsets per shard, or "
                           "disjoint id ranges); otherwise add a column that differs per shard (a shard or region "
                           "id) to the target's key and the shards' tables. `applier verify` cannot compare merged "
                           "tables, so overwrites are not found later"))
    return out


def format_report(r: ShardReport) -> str:
    lines = [f"shard merges of pipeline {r.pipeline} in {r.target}:"]
    if r.note:
        lines.append(f"  {r.note}")
    elif not r.merges:
        lines.append("  none: no target table has rows of two or more upstream tables under the current routes")
    for m in r.merges:
        lines.append(f"  {m.name} <- {', '.join(s.name for s in m.shards)}")
        for s in m.shards:
            lines.append(f"    shard {s.name}: primary key {s.key.shown()}")
        lines.append(f"    target {m.name}: primary key {m.key.shown()}")
        for f in m.findings:
            lines.append(f"    {f.level.upper()}: {f.message}")
    lines.append(f"{r.problems} problem(s), {r.warnings} warning(s)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------------
# I/O


def gather(engine: Engine, *, pipeline: str, route: Route, reflect: Reflect, target_shown: str) -> ShardReport:
    """Read the pipeline's upstream tables, their applied DDL and the merged targets' keys, and judge them. The
    applier's tables must exist (the caller checks with ``applier.migrate.current``)."""
    with engine.connect() as conn:
        sources = [(s, t) for s, t in conn.execute(
            select(tables.c.source_schema, tables.c.source_table).where(tables.c.pipeline == pipeline))]
        groups = merged_targets(sources, route)
        wanted = {(s.casefold(), t.casefold()) for ss in groups.values() for s, t in ss}
        history: dict[tuple[str, str], list[str]] = {}
        if wanted:
            rows = conn.execute(
                select(ddl_history.c.source_schema, ddl_history.c.source_table, ddl_history.c.query)
                .where(ddl_history.c.pipeline == pipeline, ddl_history.c.state == "done")
                .order_by(ddl_history.c.commit_ts, ddl_history.c.started_at))
            for s, t, q in rows:
                k = (s.casefold(), t.casefold())
                if k in wanted:
                    history.setdefault(k, []).append(q)
        merges = []
        for (ts, tt), ss in groups.items():
            shards = [Shard(s, t, shard_key(history.get((s.casefold(), t.casefold()), []))) for s, t in ss]
            try:
                with engine.connect() as own:  # a failed catalog read (PostgreSQL) must not end the others' reads
                    tkey = KnownKey(tuple(reflect(own, ts, tt).key))
            except Exception as exc:  # no such table any more, or no privilege to read its catalog
                tkey = KnownKey(None, f"the target table could not be read ({str(exc).splitlines()[0][:200]})")
            m = MergedTarget(ts, tt, shards, tkey)
            m.findings = findings_for(m)
            merges.append(m)
    return ShardReport(pipeline, target_shown, merges)
