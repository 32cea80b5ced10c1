"""MySQL / MariaDB target: the upstream statement, rewritten in place.

The statement text is kept as the user wrote it (column definitions, types, defaults, COMMENT clauses, charset and
collation tails), minus TiDB-only syntax (``applier/ddl/tidb.py``) and every comment (``applier/ddl/comments.py``:
an executable one's content becomes plain syntax, is dropped or refuses the DDL). Only these parts change:

=====================================================  ========================================================
upstream                                               downstream
=====================================================  ========================================================
``CREATE TABLE [IF NOT EXISTS] t (...)``               ``CREATE TABLE IF NOT EXISTS `s`.`t` (...)``
``CREATE TABLE t LIKE s`` / ``(LIKE s)``               both names routed; IF NOT EXISTS added
``... REFERENCES p (...)`` (foreign keys)              ``p`` routed (an ignored parent table is refused)
``DROP TABLE [IF EXISTS] a, b``                        ``DROP TABLE IF EXISTS `s`.`a`, `s`.`b``` (ignored
                                                       tables left out; one table per event, see below)
``TRUNCATE [TABLE] t``                                 ``TRUNCATE TABLE `s`.`t```
``RENAME TABLE a TO b [, c TO d]``                     ``RENAME TABLE `s`.`a` TO `s`.`b` ...`` (pairs whose
                                                       both names are ignored are left out)
``ALTER TABLE t ...``                                  table name routed; ``RENAME [TO|AS] n`` and
                                                       ``EXCHANGE PARTITION p WITH TABLE n`` names routed
``CREATE [UNIQUE|FULLTEXT|SPATIAL] INDEX i ON t``      table routed
``DROP INDEX i ON t``                                  table routed
``CREATE DATABASE|SCHEMA [IF NOT EXISTS] d``           ``CREATE DATABASE IF NOT EXISTS `d'` ...``
``DROP DATABASE|SCHEMA [IF EXISTS] d``                 ``DROP DATABASE IF EXISTS `d'``` - refused when routing
                                                       renames the schema (the target schema may hold tables
                                                       of other upstream schemas) or it is a system schema
``ALTER DATABASE [d] ...``                             name routed (inserted when omitted)
``CREATE [OR REPLACE] [ALGORITHM=..] [DEFINER=..]``    ``CREATE OR REPLACE ... VIEW `s`.`v` AS ...`` with the
``[SQL SECURITY ..] VIEW v AS select``                 DEFINER clause removed (the upstream user need not exist
                                                       downstream) and the tables after FROM/JOIN routed when
                                                       that is simple: no WITH, no three-part names, and
                                                       routing changes at most the schema of each table.
                                                       Otherwise UnsupportedDDL (kind "create_view").
``ALTER VIEW``                                         same rewriting, stays ALTER VIEW
``DROP VIEW [IF EXISTS] a, b``                         ``DROP VIEW IF EXISTS ...``
=====================================================  ========================================================

Idempotent replays: CREATE TABLE / CREATE DATABASE get ``IF NOT EXISTS``, DROP TABLE / DROP DATABASE /
DROP VIEW get ``IF EXISTS``, CREATE VIEW becomes ``CREATE OR REPLACE VIEW``. MySQL 8 has no
``IF [NOT] EXISTS`` for indexes and columns, so for ``"mysql"`` those clauses (which TiDB accepts) are removed;
for ``"mariadb"`` they are added to CREATE INDEX / DROP INDEX and to ALTER TABLE's ADD COLUMN, ADD INDEX|KEY,
ADD UNIQUE, DROP COLUMN, DROP INDEX|KEY, MODIFY, CHANGE and RENAME INDEX|KEY. Everything else (RENAME TABLE,
ADD/DROP PRIMARY KEY, partition maintenance, ...) relies on the caller's replay protection (DDL marker rows and
the "already applied" error codes).

``"mariadb"`` also maps what MariaDB 10.x spells or lacks differently: index visibility ``INVISIBLE``/``VISIBLE``
-> ``IGNORED``/``NOT IGNORED``; the MySQL 8 collations ``utf8mb4_0900_ai_ci`` -> ``utf8mb4_unicode_520_ci`` and
``utf8mb4_0900_bin`` -> ``utf8mb4_bin`` (nearest equivalents; MariaDB before 11.4 has no 0900 collations);
indexes with functional key parts ``((a + b))`` are left out when non-unique (they only speed up queries) and
refused when unique; a primary key over a generated column is refused (MariaDB forbids it).

TiDB's ``VECTOR(n)`` column type becomes ``LONGTEXT`` for both flavours: it holds TiDB's text form ``[1,2,3]``
that TiCDC sends (MySQL 9 / MariaDB 11.7 VECTOR columns accept only their own binary form, older servers none).

Statements with no meaning outside TiDB -> ``statements == []``, kind ``"other"`` (nothing to do downstream):

==========================================================  ===============================================
TiDB statement                                              why nothing is done
==========================================================  ===============================================
``ALTER TABLE t SET TIFLASH REPLICA n`` / ``SET TIFLASH``    TiFlash (columnar replica) only
``MODE``, ``ALTER TABLE t COMPACT [...]``,
``ALTER DATABASE d SET TIFLASH REPLICA n``
``ALTER TABLE t CACHE`` / ``NOCACHE``                        TiDB cached tables
``ALTER TABLE t [PARTITION p] ATTRIBUTES [=] '...'``         TiKV region attributes
``ALTER TABLE t [PARTITION p] PLACEMENT POLICY ...``,         placement rules (data location in TiKV)
``CREATE|ALTER|DROP PLACEMENT POLICY``
``ALTER TABLE t TTL ...`` / ``TTL_ENABLE`` / ``REMOVE TTL``   TiDB TTL jobs (their deletes reach us as rows)
``ALTER TABLE t AUTO_ID_CACHE|SHARD_ROW_ID_BITS|...``        TiDB row-id allocation
``ALTER TABLE t ADD VECTOR|COLUMNAR INDEX``,                 TiFlash-only indexes (kind "create_index")
``CREATE VECTOR|COLUMNAR INDEX``
``ALTER TABLE t ADD|DROP STATS_EXTENDED``                    TiDB optimizer statistics
``CREATE|ALTER|DROP SEQUENCE``                               sequences are not data; their values reach us in rows
``CREATE|ALTER|DROP RESOURCE GROUP``                         TiDB resource control
``ADMIN ...``, ``ANALYZE ...``, ``SPLIT ...``,                TiDB administration / statistics
``[CREATE|DROP] BINDING``, ``LOCK|UNLOCK STATS``,
``ALTER INSTANCE``, ``LOAD STATS``
``CREATE [GLOBAL] TEMPORARY TABLE``, ``DROP TEMPORARY``      temporary tables are not replicated by TiCDC
==========================================================  ===============================================

``RECOVER TABLE`` and ``FLASHBACK TABLE|DATABASE|CLUSTER`` are *not* silently ignored: they bring back data
upstream that TiCDC does not resend as rows, so they raise UnsupportedDDL (restore the table on the target).

UnsupportedDDL is also raised for: several statements in one event, ``CREATE TABLE ... SELECT``, a RENAME (or
``ALTER TABLE .. RENAME``/``EXCHANGE PARTITION``/``CREATE TABLE .. LIKE``/a foreign key) that links a kept
table with an ignored one, the DROP DATABASE cases above, views that cannot be routed simply, and statements
this module does not recognise.

The statement arrives prepared by ``applier.ddl.translate`` (neutralised, lexed, checked for several statements
and for TiDB-only or data-restoring statements); its text is rewritten in place (``applier/ddl/rewrite.py``),
the MariaDB mappings live in ``applier/ddl/mariadb.py``, and the statements both dialects route the same way
(DROP lists, RENAME TABLE, the DROP DATABASE guard) in ``applier/ddl/common.py``. The kinds of clause an ALTER
TABLE holds (``TranslatedDDL.alters``) are named by ``applier/ddl/syntax.py``'s :func:`alter_summary` for every
dialect alike, and the TiDB-only specifications it and this module leave out by ``applier/ddl/tidb.py``'s
:func:`tidb_only_spec`.
"""

from __future__ import annotations

from typing import Sequence

from applier.ddl.base import Context, TableRef, TranslatedDDL
from applier.ddl.common import checked_drop_schema, drop_list, expect_end, rename_tables
from applier.ddl.lexer import Cursor, Statement, Token, split_top_level
from applier.ddl.mariadb import expression_key, mariadb_collations, mariadb_create_table_checks, mariadb_visibility
from applier.ddl.rewrite import Rewrite
from applier.ddl.syntax import alter_specs, alter_summary
from applier.ddl.tidb import tidb_only_spec

__all__ = ["translate_mysql"]

# DROP DATABASE of these is refused
_MYSQL_SYSTEM = frozenset({"mysql", "information_schema", "performance_schema", "sys", "metrics_schema"})

_INDEX_WORDS = ("INDEX", "KEY", "UNIQUE", "PRIMARY", "FULLTEXT", "SPATIAL", "CONSTRAINT", "FOREIGN", "CHECK")


def mysql_quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def q(schema: str, table: str) -> str:
    return f"{mysql_quote_ident(schema)}.{mysql_quote_ident(table)}"


def translate_mysql(ctx: Context, stmt: Statement) -> TranslatedDDL:
    """Rewrite one prepared statement for a ``"mysql"`` or ``"mariadb"`` target (``ctx.dialect``)."""
    mariadb = ctx.dialect == "mariadb"
    st = Rewrite(stmt)
    sig = st.sig
    c = Cursor(sig)
    head = sig[0].upper
    if head == "CREATE":
        return _create(ctx, st, c, mariadb)
    if head == "DROP":
        return _drop(ctx, st, c, mariadb)
    if head == "ALTER":
        return _alter(ctx, st, c, mariadb)
    if head == "TRUNCATE":
        c.next()
        c.accept_kw("TABLE")
        ref = ctx.table_ref(c)
        expect_end(ctx, c)
        r = ctx.routed(ref.schema, ref.table)
        if r is None:
            return TranslatedDDL([], "truncate_table", [])
        return TranslatedDDL([f"TRUNCATE TABLE {q(*r)}"], "truncate_table", [r])
    if head == "RENAME":
        c.next()
        if not c.accept_kw("TABLE", "TABLES"):
            ctx.fail("only RENAME TABLE is supported")
        return rename_tables(ctx, c, lambda pairs: "RENAME TABLE " + ", ".join(
            f"{q(*a)} TO {q(*b)}" for a, b in pairs))
    ctx.fail(f"{head} statements are not DDL this applier understands")


# ---------------------------------------------------------------------------------------------------------
# CREATE


def _create(ctx: Context, st: Rewrite, c: Cursor, mariadb: bool) -> TranslatedDDL:
    create_tok = c.next()
    or_replace = c.accept_seq("OR", "REPLACE")
    if c.is_kw("TEMPORARY") or (c.is_kw("GLOBAL", "LOCAL") and c.is_kw("TEMPORARY", k=1)):
        return TranslatedDDL([], "other", [])
    if c.is_kw("TABLE"):
        if or_replace:
            ctx.fail("CREATE OR REPLACE TABLE is not TiDB syntax", kind="create_table")
        return _create_table(ctx, st, c, mariadb)
    if c.is_kw("DATABASE", "SCHEMA"):
        return _create_database(ctx, st, c, mariadb)
    if c.is_kw("UNIQUE", "FULLTEXT", "SPATIAL", "INDEX", "KEY", "VECTOR", "COLUMNAR", "ONLINE", "OFFLINE"):
        return _create_index(ctx, st, c, mariadb)
    if c.is_kw("ALGORITHM", "DEFINER", "SQL", "VIEW"):
        return _view(ctx, st, c, create_tok, or_replace)
    word = c.peek().text if c.peek() else ""
    ctx.fail(f"CREATE {word.upper()} is not supported")


def _create_table(ctx: Context, st: Rewrite, c: Cursor, mariadb: bool) -> TranslatedDDL:
    table_tok = c.expect_kw("TABLE")
    has_ine = c.accept_seq("IF", "NOT", "EXISTS")
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    if r is None:
        return TranslatedDDL([], "create_table", [])
    if any(t.is_word("SELECT") for t in st.sig[c.pos:]):
        ctx.fail("CREATE TABLE ... SELECT copies rows upstream that may not all reach the target as row "
                 "changes; create the table by hand", kind="create_table")
    if not has_ine:
        st.insert(table_tok.end, " IF NOT EXISTS")
    st.replace(ref.start, ref.end, q(*r))
    targets = [r]
    like_at = c.pos + 1 if c.is_op("(") and c.is_kw("LIKE", k=1) else c.pos if c.is_kw("LIKE") else None
    if like_at is not None:
        lc = Cursor(st.sig, like_at + 1)
        src = ctx.table_ref(lc)
        rs = ctx.routed(src.schema, src.table)
        if rs is None:
            ctx.fail(f"CREATE TABLE ... LIKE {src.schema}.{src.table}: the source table is ignored by routing, "
                     "so it does not exist on the target", kind="create_table")
        st.replace(src.start, src.end, q(*rs))
    else:
        _route_references(ctx, st, c.pos, len(st.sig), ref.schema)
        if c.is_op("("):
            lo, hi = c.pos + 1, c.matching()
            elements = split_top_level(st.sig, lo, hi)
            if mariadb:
                mariadb_create_table_checks(ctx, st, elements)
            for a, b in elements:
                if a < b and st.sig[a].is_word(*_INDEX_WORDS):
                    if mariadb:
                        if expression_key(st.sig, a, b, ctx):
                            _drop_element(st, elements, a, b)
                        else:
                            mariadb_visibility(st, a, b)
                elif a < b:
                    _vector_to_longtext(st, a + 1, b)
    if mariadb:
        mariadb_collations(st)
    return TranslatedDDL([st.render()], "create_table", targets)


def _route_references(ctx: Context, st: Rewrite, lo: int, hi: int, child_schema: str) -> None:
    """Route the parent table of every ``REFERENCES parent (...)`` in sig[lo:hi]."""
    for i in range(lo, hi):
        if st.sig[i].is_word("REFERENCES") and i + 1 < hi:
            saved = ctx.schema
            ctx.schema = child_schema
            try:
                ref = ctx.table_ref(Cursor(st.sig, i + 1, hi))
            finally:
                ctx.schema = saved
            r = ctx.routed(ref.schema, ref.table)
            if r is None:
                ctx.fail(f"a foreign key references {ref.schema}.{ref.table}, which routing ignores; drop the "
                         "foreign key upstream or replicate the parent table")
            st.replace(ref.start, ref.end, q(*r))


def _create_database(ctx: Context, st: Rewrite, c: Cursor, mariadb: bool) -> TranslatedDDL:
    kw = c.next()
    has_ine = c.accept_seq("IF", "NOT", "EXISTS")
    name = c.ident()
    target = ctx.routed_schema(name.ident)
    if target is None:
        return TranslatedDDL([], "create_schema", [])
    if not has_ine:
        st.insert(kw.end, " IF NOT EXISTS")
    st.replace(name.start, name.end, mysql_quote_ident(target))
    if mariadb:
        mariadb_collations(st)
    return TranslatedDDL([st.render()], "create_schema", [(target, "")])


def _create_index(ctx: Context, st: Rewrite, c: Cursor, mariadb: bool) -> TranslatedDDL:
    c.accept_kw("ONLINE", "OFFLINE")
    kind_tok = c.accept_kw("UNIQUE", "FULLTEXT", "SPATIAL", "VECTOR", "COLUMNAR")
    c.expect_kw("INDEX", "KEY")
    ine_at = c.pos
    has_ine = c.accept_seq("IF", "NOT", "EXISTS")
    name = c.ident()
    while not c.at_end and not c.is_kw("ON"):
        c.next()  # USING BTREE before ON
    c.expect_kw("ON")
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    if r is None or (kind_tok is not None and kind_tok.upper in ("VECTOR", "COLUMNAR")):
        return TranslatedDDL([], "create_index", [])
    if mariadb and expression_key(st.sig, c.pos, len(st.sig), ctx, unique=kind_tok is not None
                                  and kind_tok.is_word("UNIQUE")):
        return TranslatedDDL([], "create_index", [])
    st.replace(ref.start, ref.end, q(*r))
    if mariadb and not has_ine:
        st.insert(name.start, "IF NOT EXISTS ")
    elif not mariadb and has_ine:
        st.drop_tokens(ine_at, ine_at + 3)
    if mariadb:
        mariadb_visibility(st, c.pos, len(st.sig))
    return TranslatedDDL([st.render()], "create_index", [r])


# ---------------------------------------------------------------------------------------------------------
# Views


def _view(ctx: Context, st: Rewrite, c: Cursor, head: Token, or_replace: bool) -> TranslatedDDL:
    is_create = head.is_word("CREATE")
    kind = "create_view"
    if is_create and not or_replace:
        st.insert(head.end, " OR REPLACE")
    while not c.at_end and not c.is_kw("VIEW"):
        if c.is_kw("DEFINER") and c.is_op("=", k=1):
            lo = c.pos
            c.next()
            c.expect_op("=")
            # user: 'u'@'h', `u`@`h`, u@h, CURRENT_USER[()]
            while not c.at_end and not c.is_kw("SQL", "VIEW"):
                c.next()
            st.drop_tokens(lo, c.pos)
        else:
            c.next()
    c.expect_kw("VIEW")
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    if r is None:
        return TranslatedDDL([], kind, [])
    if c.is_op("("):
        c.skip_group()
    c.expect_kw("AS")
    body_lo = c.pos
    refs = view_table_refs(ctx, st.sig, body_lo, len(st.sig), ref.schema)
    for tref in refs:
        rt = ctx.routed(tref.schema, tref.table)
        if rt is None:
            ctx.fail(f"the view reads {tref.schema}.{tref.table}, which routing ignores", kind=kind)
        if rt[1] != tref.table:
            ctx.fail(f"the view reads {tref.schema}.{tref.table}, which routing renames to {rt[0]}.{rt[1]}; "
                     "column references in the view body cannot be rewritten safely", kind=kind)
        st.replace(tref.start, tref.end, q(*rt))
    st.replace(ref.start, ref.end, q(*r))
    return TranslatedDDL([st.render()], kind, [r])


_FROM_END = ("WHERE", "GROUP", "HAVING", "ORDER", "LIMIT", "UNION", "WINDOW", "INTO", "FOR", "LOCK", "EXCEPT",
             "INTERSECT", "SELECT", "WITH")
_JOIN = ("JOIN", "STRAIGHT_JOIN")


def view_table_refs(ctx: Context, sig: Sequence[Token], lo: int, hi: int, view_schema: str) -> list[TableRef]:
    """Tables named after FROM / JOIN / ``,`` in a SELECT; refuses what is not simple to route."""
    if lo < hi and sig[lo].is_word("WITH"):
        ctx.fail("views with common table expressions (WITH) cannot be routed safely", kind="create_view")
    for i in range(lo, hi - 4):
        if sig[i].is_ident and sig[i + 1].is_op(".") and sig[i + 2].is_ident and sig[i + 3].is_op(".") \
                and sig[i + 4].is_ident:
            ctx.fail("views with schema.table.column references cannot be routed safely", kind="create_view")
    refs: list[TableRef] = []
    saved = ctx.schema
    ctx.schema = view_schema

    def scan(a: int, b: int, in_from: bool, expect_ref: bool) -> None:
        i = a
        while i < b:
            t = sig[i]
            if t.is_op("("):
                j = Cursor(sig, i, b).matching()
                inner_is_query = i + 1 < j and sig[i + 1].is_word("SELECT", "WITH", "VALUES", "TABLE")
                if expect_ref and not inner_is_query:
                    scan(i + 1, j, True, True)
                else:
                    scan(i + 1, j, False, False)
                i = j + 1
                expect_ref = False
                continue
            if t.is_word("FROM"):
                in_from, expect_ref = True, True
            elif in_from and t.is_word(*_JOIN):
                expect_ref = True
            elif in_from and t.is_op(","):
                expect_ref = True
            elif t.is_word(*_FROM_END):
                in_from = expect_ref = False
            elif expect_ref and t.is_ident:
                if t.is_word("LATERAL"):
                    i += 1
                    continue
                if t.is_word("DUAL"):
                    expect_ref = False
                    i += 1
                    continue
                cur = Cursor(sig, i, b)
                ref = ctx.table_ref(cur)
                if not cur.is_op("("):  # a table function such as JSON_TABLE(...) is not a table
                    refs.append(ref)
                expect_ref = False
                i = cur.pos
                continue
            else:
                expect_ref = False
            i += 1

    try:
        scan(lo, hi, False, False)
    finally:
        ctx.schema = saved
    return refs


# ---------------------------------------------------------------------------------------------------------
# DROP


def _drop(ctx: Context, st: Rewrite, c: Cursor, mariadb: bool) -> TranslatedDDL:
    c.next()
    if c.accept_kw("TEMPORARY"):
        return TranslatedDDL([], "other", [])
    if c.accept_kw("TABLE", "TABLES"):
        return drop_list(ctx, c, "drop_table", lambda refs: "DROP TABLE IF EXISTS " + ", ".join(
            q(*r) for r in refs))
    if c.accept_kw("VIEW"):
        return drop_list(ctx, c, "drop_view", lambda refs: "DROP VIEW IF EXISTS " + ", ".join(
            q(*r) for r in refs))
    if c.is_kw("DATABASE", "SCHEMA"):
        c.next()
        c.accept_seq("IF", "EXISTS")
        name = c.ident()
        expect_end(ctx, c)
        target = checked_drop_schema(ctx, name.ident, _MYSQL_SYSTEM)
        if target is None:
            return TranslatedDDL([], "drop_schema", [])
        return TranslatedDDL([f"DROP DATABASE IF EXISTS {mysql_quote_ident(target)}"], "drop_schema",
                             [(target, "")])
    c.accept_kw("ONLINE", "OFFLINE")
    if c.accept_kw("INDEX", "KEY"):
        ie_at = c.pos
        has_ie = c.accept_seq("IF", "EXISTS")
        name = c.ident()
        c.expect_kw("ON")
        ref = ctx.table_ref(c)
        r = ctx.routed(ref.schema, ref.table)
        if r is None:
            return TranslatedDDL([], "drop_index", [])
        st.replace(ref.start, ref.end, q(*r))
        if mariadb and not has_ie:
            st.insert(name.start, "IF EXISTS ")
        elif not mariadb and has_ie:
            st.drop_tokens(ie_at, ie_at + 2)
        return TranslatedDDL([st.render()], "drop_index", [r])
    word = c.peek().text if c.peek() else ""
    ctx.fail(f"DROP {word.upper()} is not supported")


# ---------------------------------------------------------------------------------------------------------
# ALTER


def _alter(ctx: Context, st: Rewrite, c: Cursor, mariadb: bool) -> TranslatedDDL:
    head = c.next()
    c.accept_kw("ONLINE", "OFFLINE")
    c.accept_kw("IGNORE")
    if c.is_kw("DATABASE", "SCHEMA"):
        return _alter_database(ctx, st, c, mariadb)
    if c.is_kw("ALGORITHM", "DEFINER", "SQL", "VIEW"):
        return _view(ctx, st, c, head, False)
    if not c.accept_kw("TABLE"):
        word = c.peek().text if c.peek() else ""
        ctx.fail(f"ALTER {word.upper()} is not supported")
    return _alter_table(ctx, st, c, mariadb)


def _alter_table(ctx: Context, st: Rewrite, c: Cursor, mariadb: bool) -> TranslatedDDL:
    ref = ctx.table_ref(c)
    specs = alter_specs(st.sig, c.pos, len(st.sig))
    summary = alter_summary(st.sig, specs)  # st.sig: the upstream tokens, whatever the edits
    r = ctx.routed(ref.schema, ref.table)
    st.replace(ref.start, ref.end, q(*r) if r else "")
    kind = "alter_table"
    targets = [r] if r else []
    kept = 0
    only_tidb = True  # every specification was TiDB-only (or there were none)
    for lo, hi in specs:
        what = classify_spec(st.sig, lo, hi)
        if what in ("tidb", "empty"):
            _drop_spec(st, specs, lo, hi)
            continue
        only_tidb = False
        kept += 1
        if what == "rename":
            kind = "rename_table"
            targets.extend(_route_renamed(ctx, st, ref, r, lo, hi))
        elif what == "exchange":
            targets.extend(_route_exchanged(ctx, st, ref, r, lo, hi))
        elif r is not None:
            if mariadb and what == "add_index" and expression_key(st.sig, lo, hi, ctx):
                _drop_spec(st, specs, lo, hi)
                kept -= 1
                continue
            _route_references(ctx, st, lo, hi, ref.schema)
            _if_exists_clauses(st, lo, hi, what, mariadb)
            if what in ("add_column", "modify_column"):
                _vector_to_longtext(st, lo + 1, hi)
            if mariadb and what in ("add_index", "alter_index"):
                mariadb_visibility(st, lo, hi)
    if kept == 0 and only_tidb and r is not None:
        return TranslatedDDL([], "other", [])
    stmts: list[str] = []
    if r is not None and kept:
        if mariadb:
            mariadb_collations(st)
        stmts = [st.render()]
    return TranslatedDDL(stmts, kind, list(dict.fromkeys(targets)) if stmts else [],
                         alters=summary.clauses, added_columns=summary.added_columns)


def _route_renamed(ctx: Context, st: Rewrite, ref: TableRef, r: tuple[str, str] | None, lo: int, hi: int
                   ) -> list[tuple[str, str]]:
    """``RENAME [TO|AS] new`` in sig[lo:hi]: route the new name, which must be kept or ignored as the table is."""
    nc = Cursor(st.sig, lo + 1, hi)
    nc.accept_kw("TO", "AS")
    new = ctx.table_ref(nc)
    rn = ctx.routed(new.schema, new.table)
    if (r is None) != (rn is None):
        ctx.fail(f"ALTER TABLE {ref.schema}.{ref.table} RENAME TO {new.schema}.{new.table} moves a table "
                 "between a replicated name and an ignored one; change the routing rules so both names "
                 "are replicated or both ignored", kind="rename_table")
    if rn is None:
        return []
    st.replace(new.start, new.end, q(*rn))
    return [rn]


def _route_exchanged(ctx: Context, st: Rewrite, ref: TableRef, r: tuple[str, str] | None, lo: int, hi: int
                     ) -> list[tuple[str, str]]:
    """``EXCHANGE PARTITION p WITH TABLE other`` in sig[lo:hi]: route the other table, which must be kept or
    ignored as the altered table is."""
    i = next((k for k in range(lo, hi) if st.sig[k].is_word("TABLE")), hi)
    other = ctx.table_ref(Cursor(st.sig, i + 1, hi))
    ro = ctx.routed(other.schema, other.table)
    if (r is None) != (ro is None):
        ctx.fail(f"EXCHANGE PARTITION between {ref.schema}.{ref.table} and {other.schema}.{other.table} "
                 "links a replicated table with an ignored one")
    if ro is None:
        return []
    st.replace(other.start, other.end, q(*ro))
    return [ro]


def classify_spec(sig: Sequence[Token], lo: int, hi: int) -> str:
    """A coarse name for one ALTER TABLE specification (what the MySQL rewriter needs to know)."""
    if lo >= hi:
        return "empty"
    if tidb_only_spec(sig, lo, hi):
        return "tidb"
    c = Cursor(sig, lo, hi)
    w = sig[lo].upper
    nxt = sig[lo + 1].upper if lo + 1 < hi else ""
    if w == "RENAME" and nxt not in ("COLUMN", "INDEX", "KEY"):
        return "rename"
    if w == "EXCHANGE":
        return "exchange"
    if w == "ADD":
        c.next()
        if c.is_kw("INDEX", "KEY", "UNIQUE", "PRIMARY", "FULLTEXT", "SPATIAL", "CONSTRAINT", "FOREIGN", "CHECK"):
            return "add_index"
        if c.is_kw("PARTITION"):
            return "partition"
        return "add_column"
    if w == "DROP":
        if nxt in ("INDEX", "KEY"):
            return "drop_index"
        if nxt in ("PRIMARY", "FOREIGN", "CHECK", "CONSTRAINT", "PARTITION"):
            return "drop_other"
        return "drop_column"
    if w == "ALTER" and nxt in ("INDEX", "KEY"):
        return "alter_index"
    if w == "RENAME" and nxt in ("INDEX", "KEY"):
        return "rename_index"
    if w in ("MODIFY", "CHANGE"):
        return "modify_column"
    return "other"


def _drop_spec(st: Rewrite, specs: list[tuple[int, int]], lo: int, hi: int) -> None:
    """Remove one ALTER TABLE specification and one separating comma."""
    sig = st.sig
    idx = specs.index((lo, hi))
    if lo >= hi:
        # an empty spec: remove a neighbouring comma if any
        if idx + 1 < len(specs):
            comma = sig[hi]  # the comma that ended it
            st.replace(comma.start, comma.end, "")
        return
    if idx + 1 < len(specs):
        nlo = specs[idx + 1][0]
        end = sig[nlo].start if nlo < len(sig) else sig[hi].end
        st.replace(sig[lo].start, end, "")
    elif idx > 0:
        comma = sig[lo - 1]
        st.replace(comma.start, sig[hi - 1].end, "")
    else:
        st.replace(sig[lo].start, sig[hi - 1].end, "")


def _if_exists_clauses(st: Rewrite, lo: int, hi: int, what: str, mariadb: bool) -> None:
    """MySQL 8 lacks IF [NOT] EXISTS in ALTER TABLE specs (drop them); MariaDB has it (add it)."""
    sig = st.sig
    c = Cursor(sig, lo, hi)
    c.next()  # ADD / DROP
    if what == "add_column":
        c.accept_kw("COLUMN")
        probe = ("IF", "NOT", "EXISTS")
    elif what in ("drop_column", "modify_column"):
        c.accept_kw("COLUMN")
        probe = ("IF", "EXISTS")
    elif what == "add_index":
        if c.accept_kw("INDEX", "KEY"):
            pass
        elif c.accept_kw("UNIQUE"):
            c.accept_kw("INDEX", "KEY")
        else:
            return
        probe = ("IF", "NOT", "EXISTS")
    elif what in ("drop_index", "rename_index"):
        c.next()
        probe = ("IF", "EXISTS")
    else:
        return
    at = c.pos
    present = c.accept_seq(*probe)
    if mariadb and not present:
        nxt = c.peek()
        if nxt is not None and nxt.is_ident and not (what == "add_column" and nxt.is_op("(")):
            st.insert(nxt.start, " ".join(probe) + " ")
    elif not mariadb and present:
        st.drop_tokens(at, at + len(probe))


def _alter_database(ctx: Context, st: Rewrite, c: Cursor, mariadb: bool) -> TranslatedDDL:
    kw = c.next()
    tok = c.peek()
    if tok is not None and tok.is_ident and not tok.is_word("DEFAULT", "CHARACTER", "CHARSET", "COLLATE",
                                                             "ENCRYPTION", "READ", "SET"):
        c.next()
        name = tok.ident
    else:
        tok = None
        name = ctx.schema
        if not name:
            ctx.fail("ALTER DATABASE without a name and the event names no schema")
    if c.at_end:
        return TranslatedDDL([], "other", [])
    target = ctx.routed_schema(name)
    if target is None:
        return TranslatedDDL([], "other", [])
    if tok is not None:
        st.replace(tok.start, tok.end, mysql_quote_ident(target))
    else:
        st.insert(kw.end, " " + mysql_quote_ident(target))
    if mariadb:
        mariadb_collations(st)
    return TranslatedDDL([st.render()], "other", [(target, "")])


# ---------------------------------------------------------------------------------------------------------
# Column-list rewrites


def _drop_element(st: Rewrite, elements: list[tuple[int, int]], lo: int, hi: int) -> None:
    """Remove one element of a CREATE TABLE column list and one separating comma."""
    idx = elements.index((lo, hi))
    sig = st.sig
    if idx > 0:
        st.replace(sig[lo - 1].start, sig[hi - 1].end, "")
    elif idx + 1 < len(elements):
        st.replace(sig[lo].start, sig[elements[idx + 1][0]].start, "")


def _vector_to_longtext(st: Rewrite, lo: int, hi: int) -> None:
    """TiDB's VECTOR(n) column type -> LONGTEXT holding TiDB's text form '[1,2,3]' (what TiCDC sends);
    MySQL 9 and MariaDB 11.7 VECTOR columns only accept their own binary form."""
    sig = st.sig
    for i in range(lo, hi):
        t = sig[i]
        if not t.is_word("VECTOR") or i == 0 or not sig[i - 1].is_ident or sig[i - 1].is_word(
                "ADD", "CREATE", "COLUMN", "MODIFY", "CHANGE", "TABLE"):
            continue
        if i + 1 < hi and sig[i + 1].is_word("INDEX", "KEY"):
            continue
        end = t.end
        j = i + 1
        if j + 2 < hi and sig[j].is_op("<") and sig[j + 2].is_op(">"):
            end = sig[j + 2].end
            j += 3
        if j < hi and sig[j].is_op("("):
            k = Cursor(sig, j, hi).matching()
            end = sig[k].end
        st.replace(t.start, end, "LONGTEXT")
