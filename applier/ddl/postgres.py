"""PostgreSQL target: parse the MySQL/TiDB DDL and render PostgreSQL DDL from an explicit type map.

The upstream text is neutralised (``applier/ddl/tidb.py``), tokenised and parsed with a small recursive-descent
parser for the DDL subset below (``applier/ddl/syntax.py``); nothing of the upstream text is copied into the
output except identifiers (always double-quoted) and literal values (always re-rendered as PostgreSQL literals).

Type map (MySQL/TiDB -> PostgreSQL)
===================================

=====================================  ===========================  ==================================================
MySQL / TiDB                           PostgreSQL                   why
=====================================  ===========================  ==================================================
tinyint, tinyint unsigned              smallint                     -128..255 fits
smallint                               smallint
smallint unsigned                      integer                      0..65535 does not fit smallint
mediumint [unsigned], int              integer
int unsigned                           bigint                       0..4294967295
bigint                                 bigint
bigint unsigned, serial                numeric(20,0)                0..18446744073709551615; exact, no wrap-around
bool, boolean, tinyint(1)              smallint                     MySQL booleans are tinyint(1) and can hold any
                                                                    -128..127 value; PostgreSQL boolean would lose
                                                                    values and reject the integers rows carry
decimal(p,s) / numeric / dec / fixed   numeric(p,s)                 decimal = decimal(10,0), decimal(p) = (p,0)
float, float(p<=24), float(m,d)        real
double, real, float(p>24)              double precision             (REAL is DOUBLE unless REAL_AS_FLOAT)
char(n), varchar(n), nchar, nvarchar   varchar(n)                   MySQL CHAR strips trailing spaces when read, so
                                                                    the values TiCDC sends carry no padding;
                                                                    PostgreSQL char(n) would pad them back and
                                                                    compare differently. n counts characters in
                                                                    both. char/varchar(0) -> text.
tinytext, text, mediumtext, longtext   text                         also char/varchar/text ``CHARACTER SET binary``
                                                                    -> bytea (they are binary strings)
binary(n), varbinary(n), *blob         bytea
date                                   date
datetime(n)                            timestamp(n) without time    n defaults to 0 as in MySQL
                                       zone
timestamp(n)                           timestamp(n) with time zone  MySQL TIMESTAMP is an instant (stored UTC)
time(n)                                interval(n)                  MySQL TIME ranges over -838:59:59..838:59:59 (an
                                                                    elapsed time, not a time of day); PostgreSQL
                                                                    time only holds 00:00:00..24:00:00
year                                   smallint
bit(n)                                 bit varying(n)               keeps the bits and the width limit; bit(64)
                                                                    values exceed bigint. Defaults are written as
                                                                    n-digit bit strings; writers send bit strings.
enum(...), set(...)                    text                         the text form of the value (no CHECK: ALTERs that
                                                                    add members would need it rewritten); the members
                                                                    are kept in the column's COMMENT (below)
json                                   jsonb
vector(n) (TiDB)                       text                         the TiDB text form '[1,2,3]' (no pgvector)
geometry / point / ... (spatial)       UnsupportedDDL
=====================================  ===========================  ==================================================

Upstream type comments: PostgreSQL's ``text`` cannot say which members an ENUM or SET had, yet the Open
Protocol, Canal-JSON and Simple send ENUM/SET values as ordinals / bitmasks, which the writer must turn back into
member names. So every ENUM/SET column gets ``COMMENT ON COLUMN .. IS 'applier:enum(''a'',''b'')'`` (or
``applier:set(...)``; members as in MySQL, quotes doubled, trailing spaces removed as MySQL removes them) right
after CREATE TABLE / ADD COLUMN / MODIFY / CHANGE, and a MODIFY/CHANGE to any other type clears the comment.
``CREATE TABLE .. LIKE`` copies comments. ``applier/ddl/pg_types.py``'s :func:`type_comment` writes the comment
and :func:`parse_type_comment` reads it back (``applier/sinks/postgres.py`` uses it); upstream column COMMENTs are
dropped, so a column comment on a replicated table is always the applier's own.

Column attributes: NOT NULL is kept; DEFAULT literals are re-rendered for the target type (strings,
numbers, ``x'..'``/``0x..`` and ``b'..'``/``0b..`` literals, TRUE/FALSE, CURRENT_TIMESTAMP/NOW()/LOCALTIME[STAMP]
-> CURRENT_TIMESTAMP for timestamptz and LOCALTIMESTAMP for timestamp, CURRENT_DATE); zero dates
('0000-00-00 ...', 0) have no PostgreSQL value and are dropped; other expression defaults are dropped in
CREATE TABLE / MODIFY (every replicated row carries every column, so a default only matters for rows that
existed before an ADD COLUMN) and refused in ADD COLUMN. AUTO_INCREMENT is dropped (values come from upstream),
ON UPDATE CURRENT_TIMESTAMP is dropped (upstream computes the value and sends it), COMMENT, COLLATE,
CHARACTER SET, COLUMN_FORMAT, STORAGE, VISIBLE/INVISIBLE and CHECK constraints are dropped, FOREIGN KEY /
REFERENCES are dropped (the applier writes tables in batches, not in upstream statement order across tables;
upstream enforced them). Generated columns (``AS (expr) [VIRTUAL|STORED]``) become ordinary columns: MySQL
expressions cannot be translated reliably, so the column holds the value upstream computed - the writer must
therefore write generated columns' values on PostgreSQL. Adding a generated column to an existing table is
refused (the values of existing rows would be missing).

Table options (ENGINE, CHARSET, COLLATE, COMMENT, AUTO_INCREMENT, ROW_FORMAT, PARTITION BY ...) are dropped:
the target table is a plain, unpartitioned table.

Statements
==========

=================================================  ===============================================================
MySQL / TiDB                                       PostgreSQL
=================================================  ===============================================================
CREATE TABLE [IF NOT EXISTS] t (...)               CREATE TABLE IF NOT EXISTS "s"."t" (... , CONSTRAINT "t_pkey"
                                                   PRIMARY KEY (...)) + CREATE [UNIQUE] INDEX IF NOT EXISTS per
                                                   UNIQUE KEY / KEY / INDEX. Prefix parts ``col(n)``: dropped on
                                                   short columns (varchar(n<=512), [var]binary(n<=2000)), else
                                                   indexed as ``substring(col from 1 for n)`` (long values cannot
                                                   exceed the ~2.7 kB btree entry limit; such an index is not made
                                                   UNIQUE: upstream enforces it, writers cannot see it). A
                                                   primary key always uses whole columns (writers need them for ON
                                                   CONFLICT): a TEXT/BLOB primary key value above ~2.7 kB fails.
CREATE TABLE t LIKE s                              CREATE TABLE IF NOT EXISTS t (LIKE s INCLUDING DEFAULTS INCLUDING
                                                   COMMENTS) + a DO
                                                   block that copies s's primary key and indexes under t's names
DROP TABLE [IF EXISTS] a, b                        DROP TABLE IF EXISTS "s"."a", "s"."b"
TRUNCATE [TABLE] t                                 TRUNCATE TABLE "s"."t"
RENAME TABLE a TO b / ALTER TABLE a RENAME [TO] b  ALTER TABLE IF EXISTS "s"."a" RENAME TO "b" (+ ALTER TABLE IF
                                                   EXISTS .. SET SCHEMA "s2" when the schema changes) + a DO block
                                                   renaming the table's indexes to the new table's names
ALTER TABLE ADD [COLUMN] c ...                     ADD COLUMN IF NOT EXISTS (NOT NULL without DEFAULT: filled with
                                                   MySQL's implicit default - 0, '', first enum member, zero bytes -
                                                   like upstream, then the default is dropped; temporal NOT NULL
                                                   columns without a default are added nullable: their implicit
                                                   default is a zero date)
ALTER TABLE DROP [COLUMN] c                        DROP COLUMN IF EXISTS
ALTER TABLE MODIFY c ... / CHANGE a b ...          [RENAME COLUMN a TO b], DROP DEFAULT, ALTER COLUMN TYPE t USING
                                                   "c"::t, [SET DEFAULT], SET NOT NULL or DROP NOT NULL (skipped for
                                                   primary key columns, which MySQL keeps NOT NULL). FIRST/AFTER
                                                   are dropped (column order does not matter to the applier).
ALTER TABLE ALTER [COLUMN] c SET/DROP DEFAULT      ALTER COLUMN SET/DROP DEFAULT (a default with no PostgreSQL form
                                                   is skipped: it only affects rows inserted without the column)
ALTER TABLE RENAME COLUMN a TO b                   RENAME COLUMN
ALTER TABLE ADD INDEX/KEY/UNIQUE, CREATE INDEX     CREATE [UNIQUE] INDEX IF NOT EXISTS
ALTER TABLE ADD PRIMARY KEY                        DO block: ADD CONSTRAINT "t_pkey" PRIMARY KEY unless one exists
ALTER TABLE DROP INDEX/KEY, DROP INDEX i ON t      DROP INDEX IF EXISTS ("PRIMARY" -> drop the primary key)
ALTER TABLE DROP PRIMARY KEY                       ALTER TABLE .. DROP CONSTRAINT IF EXISTS "t_pkey"
ALTER TABLE RENAME INDEX a TO b                    ALTER INDEX IF EXISTS .. RENAME TO ..
CREATE DATABASE|SCHEMA d                           CREATE SCHEMA IF NOT EXISTS "d"
DROP DATABASE|SCHEMA d                             DROP SCHEMA IF EXISTS "d" CASCADE (refused when routing renames
                                                   the schema, or for public/pg_*/system schemas)
DROP VIEW [IF EXISTS] v                            DROP VIEW IF EXISTS
ALTER DATABASE, table options, ALTER INDEX ..      nothing (statements == [])
VISIBLE, ADD/REORGANIZE/COALESCE/REMOVE
PARTITION(ING), PARTITION BY, FULLTEXT/SPATIAL
and non-unique expression indexes (performance
only), FOREIGN KEY / CHECK changes, TiDB-only
statements (see applier/ddl/mysql.py)
=================================================  ===============================================================

Index names: PostgreSQL index names are unique per schema, so an index ``i`` of table ``t`` is named
``t__i`` (MySQL index names are case-insensitive, so ``i`` is lower-cased; the primary key is ``t_pkey``);
when that exceeds PostgreSQL's 63-byte limit it becomes ``i_<md5(t || '.' || i)>`` (``pk_<md5(t)>``) and
the MySQL name is kept in the index's COMMENT. Unnamed MySQL indexes get MySQL's name (first column,
then ``_2``, ``_3``) so a later ``DROP INDEX`` finds them. Renaming a table renames its indexes the same way.

Raises UnsupportedDDL for: CREATE VIEW / ALTER VIEW (MySQL SELECT syntax), CREATE TABLE ... SELECT,
TRUNCATE / DROP / EXCHANGE PARTITION (they change rows that TiCDC does not send, and the target table has no
partitions), unique expression indexes, spatial types, ADD COLUMN with a generated column, AUTO_INCREMENT or
an expression default that has no PostgreSQL form, RECOVER/FLASHBACK, and statements not listed above.

Identifiers keep their case and are always quoted, as the writers quote them; a MySQL statement that refers
to a column with a different letter case than it was created with will not find it on PostgreSQL.

Where the pieces live: the statement arrives prepared by ``applier.ddl.translate`` (neutralised, lexed, checked
for several statements and for TiDB-only or data-restoring statements); this module decides, statement by
statement, what PostgreSQL runs. The type map, defaults and type comments are ``applier/ddl/pg_types.py``'s, the
index and key statements ``applier/ddl/pg_tables.py``'s, quoting and index names ``applier/ddl/pg_sql.py``'s;
DROP lists, RENAME TABLE and the DROP DATABASE guard are routed as for MySQL (``applier/ddl/common.py``), and an
ALTER TABLE's kinds of clause (``TranslatedDDL.alters``) are named as for MySQL (``applier/ddl/syntax.py``'s
:func:`alter_summary`), from the upstream statement rather than from the PostgreSQL statements rendered.
"""

from __future__ import annotations

from applier.ddl.base import Context, TranslatedDDL, Untranslatable
from applier.ddl.common import checked_drop_schema, drop_list, expect_end, rename_tables
from applier.ddl.lexer import Cursor, LexError, Statement, split_top_level
from applier.ddl.pg_sql import is_hashed, lit, pg_index_name, qi, qn
from applier.ddl.pg_tables import IndexNames, TargetTable, comment_sql, copy_indexes_block, rename_table_statements
from applier.ddl.pg_types import column_sql, pg_default, pg_type, type_comment
from applier.ddl.syntax import (
    ColDef,
    IndexDef,
    IndexPart,
    alter_specs,
    alter_summary,
    column_list,
    parse_column,
    parse_default,
    parse_index_def,
    parse_key_parts,
    starts_index,
)
from applier.ddl.tidb import tidb_only_spec

__all__ = ["translate_postgres"]

_PG_SYSTEM = frozenset({"public", "information_schema", "pg_catalog", "pg_toast", "mysql",
                        "performance_schema", "sys", "metrics_schema"})


# ---------------------------------------------------------------------------------------------------------
# Entry point


def translate_postgres(ctx: Context, stmt: Statement) -> TranslatedDDL:
    """Render PostgreSQL DDL for one prepared statement."""
    try:
        return _dispatch(ctx, Cursor(stmt.sig))
    except Untranslatable as exc:
        ctx.fail(exc.reason, kind=exc.kind)


def _dispatch(ctx: Context, c: Cursor) -> TranslatedDDL:
    head = c.next().upper
    if head == "CREATE":
        return _create(ctx, c)
    if head == "DROP":
        return _drop(ctx, c)
    if head == "ALTER":
        c.accept_kw("ONLINE", "OFFLINE")
        c.accept_kw("IGNORE")
        if c.is_kw("DATABASE", "SCHEMA"):
            return TranslatedDDL([], "other", [])  # charset/collation/placement: nothing in PostgreSQL
        if c.is_kw("ALGORITHM", "DEFINER", "SQL", "VIEW"):
            return _view(ctx, c)
        if c.accept_kw("TABLE"):
            return _alter_table(ctx, c)
        ctx.fail(f"ALTER {c.peek().text.upper() if c.peek() else ''} is not supported")
    if head == "TRUNCATE":
        c.accept_kw("TABLE")
        ref = ctx.table_ref(c)
        expect_end(ctx, c)
        r = ctx.routed(ref.schema, ref.table)
        if r is None:
            return TranslatedDDL([], "truncate_table", [])
        return TranslatedDDL([f"TRUNCATE TABLE {qn(*r)}"], "truncate_table", [r])
    if head == "RENAME":
        if not c.accept_kw("TABLE", "TABLES"):
            ctx.fail("only RENAME TABLE is supported")
        return rename_tables(ctx, c, lambda pairs: [s for a, b in pairs for s in rename_table_statements(a, b)])
    ctx.fail(f"{head} statements are not DDL this applier understands")


def _create(ctx: Context, c: Cursor) -> TranslatedDDL:
    or_replace = c.accept_seq("OR", "REPLACE")
    if c.is_kw("TEMPORARY") or (c.is_kw("GLOBAL", "LOCAL") and c.is_kw("TEMPORARY", k=1)):
        return TranslatedDDL([], "other", [])
    if c.accept_kw("TABLE"):
        if or_replace:
            ctx.fail("CREATE OR REPLACE TABLE is not TiDB syntax", kind="create_table")
        return _create_table(ctx, c)
    if c.accept_kw("DATABASE", "SCHEMA"):
        c.accept_seq("IF", "NOT", "EXISTS")
        name = c.ident().ident
        target = ctx.routed_schema(name)
        if target is None:
            return TranslatedDDL([], "create_schema", [])
        return TranslatedDDL([f"CREATE SCHEMA IF NOT EXISTS {qi(target)}"], "create_schema", [(target, "")])
    if c.is_kw("UNIQUE", "FULLTEXT", "SPATIAL", "INDEX", "KEY", "VECTOR", "COLUMNAR", "ONLINE", "OFFLINE"):
        return _create_index(ctx, c)
    if c.is_kw("ALGORITHM", "DEFINER", "SQL", "VIEW"):
        return _view(ctx, c)
    ctx.fail(f"CREATE {c.peek().text.upper() if c.peek() else ''} is not supported")


def _drop(ctx: Context, c: Cursor) -> TranslatedDDL:
    if c.accept_kw("TEMPORARY"):
        return TranslatedDDL([], "other", [])
    if c.accept_kw("TABLE", "TABLES"):
        return drop_list(ctx, c, "drop_table",
                         lambda refs: "DROP TABLE IF EXISTS " + ", ".join(qn(*r) for r in refs))
    if c.accept_kw("VIEW"):
        return drop_list(ctx, c, "drop_view",
                         lambda refs: "DROP VIEW IF EXISTS " + ", ".join(qn(*r) for r in refs))
    if c.accept_kw("DATABASE", "SCHEMA"):
        c.accept_seq("IF", "EXISTS")
        name = c.ident().ident
        target = checked_drop_schema(ctx, name, _PG_SYSTEM)
        if target is None or target.lower().startswith("pg_"):
            if target is not None:
                ctx.fail(f"dropping the target schema {target!r} is refused", kind="drop_schema")
            return TranslatedDDL([], "drop_schema", [])
        return TranslatedDDL([f"DROP SCHEMA IF EXISTS {qi(target)} CASCADE"], "drop_schema", [(target, "")])
    c.accept_kw("ONLINE", "OFFLINE")
    if c.accept_kw("INDEX", "KEY"):
        c.accept_seq("IF", "EXISTS")
        name = c.ident().ident
        c.expect_kw("ON")
        ref = ctx.table_ref(c)
        r = ctx.routed(ref.schema, ref.table)
        if r is None:
            return TranslatedDDL([], "drop_index", [])
        return TranslatedDDL([TargetTable(*r).drop_index(name)], "drop_index", [r])
    ctx.fail(f"DROP {c.peek().text.upper() if c.peek() else ''} is not supported")


def _view(ctx: Context, c: Cursor) -> TranslatedDDL:
    while not c.at_end and not c.is_kw("VIEW"):
        c.next()
    c.expect_kw("VIEW")
    ref = ctx.table_ref(c)
    if ctx.routed(ref.schema, ref.table) is None:
        return TranslatedDDL([], "create_view", [])
    ctx.fail("views are written in MySQL's SELECT syntax, which is not translated to PostgreSQL; create the "
             "view on the target by hand", kind="create_view")


# ---------------------------------------------------------------------------------------------------------
# CREATE TABLE / CREATE INDEX


def _create_table(ctx: Context, c: Cursor) -> TranslatedDDL:
    c.accept_seq("IF", "NOT", "EXISTS")
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    if r is None:
        return TranslatedDDL([], "create_table", [])
    if any(t.is_word("SELECT") for t in c.toks[c.pos:c.end]):
        raise Untranslatable("CREATE TABLE ... SELECT copies rows upstream that may not all reach the target as "
                             "row changes; create the table by hand", kind="create_table")
    tbl = TargetTable(*r)
    like = c.accept_kw("LIKE") is not None
    if not like and c.is_op("(") and c.is_kw("LIKE", k=1):
        c.pos += 2
        like = True
    if like:
        return TranslatedDDL(_create_table_like(ctx, tbl, c), "create_table", [r])
    columns, indexes = column_list(c)
    return TranslatedDDL(_create_table_statements(tbl, columns, indexes), "create_table", [r])


def _create_table_like(ctx: Context, tbl: TargetTable, c: Cursor) -> list[str]:
    """``LIKE src``: PostgreSQL's LIKE copies columns, defaults and comments, and a DO block copies the keys and
    indexes under the new table's index names."""
    src_ref = ctx.table_ref(c)
    rs = ctx.routed(src_ref.schema, src_ref.table)
    if rs is None:
        raise Untranslatable(f"CREATE TABLE ... LIKE {src_ref.schema}.{src_ref.table}: the source table is "
                             "ignored by routing, so it does not exist on the target", kind="create_table")
    src = TargetTable(*rs)
    return [
        f"CREATE TABLE IF NOT EXISTS {tbl.q} (LIKE {src.q} INCLUDING DEFAULTS INCLUDING COMMENTS)",
        copy_indexes_block(src, tbl),
    ]


def _create_table_statements(tbl: TargetTable, columns: list[ColDef], indexes: list[IndexDef]) -> list[str]:
    """CREATE TABLE with the primary key inline, then the column comments, then one CREATE INDEX per index."""
    pk = next((i for i in indexes if i.kind == "primary"), None)
    if pk is not None and pk.has_expression:
        raise Untranslatable("a primary key on an expression", kind="create_table")
    pk_cols = {p.column.lower() for p in pk.parts} if pk else set()
    lines = []
    for col in columns:
        sql, _ = column_sql(col)
        if col.name.lower() in pk_cols and not sql.endswith("NOT NULL"):
            sql += " NOT NULL"
        lines.append("  " + sql)
    if pk is not None:
        cols = ", ".join(qi(p.column) for p in pk.parts)
        lines.append(f"  CONSTRAINT {qi(pg_index_name(tbl.table, 'PRIMARY'))} PRIMARY KEY ({cols})")
    stmts = [f"CREATE TABLE IF NOT EXISTS {tbl.q} (\n" + ",\n".join(lines) + "\n)"]
    stmts.extend(comment_sql(tbl, col.name, col.type) for col in columns if type_comment(col.type) is not None)
    names = IndexNames([i.name for i in indexes if i.name])
    types = {col.name.lower(): col.type for col in columns}
    for idx in indexes:
        if idx.kind == "primary":
            continue
        stmts.extend(tbl.index_statements(idx, names.name_for(idx), types))
    return stmts


def _create_index(ctx: Context, c: Cursor) -> TranslatedDDL:
    c.accept_kw("ONLINE", "OFFLINE")
    kind_tok = c.accept_kw("UNIQUE", "FULLTEXT", "SPATIAL", "VECTOR", "COLUMNAR")
    c.expect_kw("INDEX", "KEY")
    c.accept_seq("IF", "NOT", "EXISTS")
    name = c.ident().ident
    while c.accept_kw("USING", "TYPE"):
        c.next()
    c.expect_kw("ON")
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    kind = kind_tok.upper.lower() if kind_tok else "index"
    if r is None or kind in ("fulltext", "spatial", "vector", "columnar"):
        return TranslatedDDL([], "create_index", [])  # TiFlash / full-text / spatial: performance only
    idx = IndexDef(kind, name, parse_key_parts(c))
    stmts = TargetTable(*r).index_statements(idx, name)
    return TranslatedDDL(stmts, "create_index", [r] if stmts else [])


# ---------------------------------------------------------------------------------------------------------
# ALTER TABLE

_TABLE_OPTION_WORDS = {
    "AUTO_INCREMENT", "AVG_ROW_LENGTH", "CHARACTER", "CHARSET", "CHECKSUM", "COLLATE", "COMMENT", "COMPRESSION",
    "CONNECTION", "DATA", "INDEX", "DELAY_KEY_WRITE", "ENCRYPTION", "ENGINE", "ENGINE_ATTRIBUTE", "INSERT_METHOD",
    "KEY_BLOCK_SIZE", "MAX_ROWS", "MIN_ROWS", "PACK_KEYS", "PASSWORD", "ROW_FORMAT", "SECONDARY_ENGINE",
    "SECONDARY_ENGINE_ATTRIBUTE", "STATS_AUTO_RECALC", "STATS_PERSISTENT", "STATS_SAMPLE_PAGES", "TABLESPACE",
    "UNION", "ALGORITHM", "LOCK", "FORCE", "ORDER", "ENABLE", "DISABLE", "WITH", "WITHOUT", "CONVERT",
    "DEFAULT", "SECONDARY_LOAD", "SECONDARY_UNLOAD",
}


def _alter_table(ctx: Context, c: Cursor) -> TranslatedDDL:
    ref = ctx.table_ref(c)
    r = ctx.routed(ref.schema, ref.table)
    specs = alter_specs(c.toks, c.pos, c.end)
    summary = alter_summary(c.toks, specs)
    tbl = TargetTable(*r) if r else None
    stmts: list[str] = []
    tail: list[str] = []  # the table rename, always last
    targets = [r] if r else []
    kind = "alter_table"
    names = IndexNames()
    only_tidb = True  # every specification was TiDB-only (or there were none): kind "other"
    for lo, hi in specs:
        sc = Cursor(c.toks, lo, hi)
        if sc.at_end:
            continue
        w = sc.peek().upper
        # RENAME TO / AS: routed even for an ignored table (a kept/ignored mix is refused)
        if w == "RENAME" and not sc.is_kw("COLUMN", "INDEX", "KEY", k=1):
            sc.next()
            sc.accept_kw("TO", "AS")
            new = ctx.table_ref(sc)
            rn = ctx.routed(new.schema, new.table)
            kind = "rename_table"
            only_tidb = False
            if (r is None) != (rn is None):
                raise Untranslatable(f"ALTER TABLE {ref.schema}.{ref.table} RENAME TO {new.schema}.{new.table} moves "
                                     "a table between a replicated name and an ignored one; change the routing rules "
                                     "so both names are replicated or both ignored", kind="rename_table")
            if rn is not None and rn != r:
                tail.extend(rename_table_statements(r, rn))
                targets.append(rn)
            continue
        if tbl is None:
            only_tidb = False
            continue
        out = _alter_spec(tbl, sc, names)
        if out is not None:
            only_tidb = False
            stmts.extend(out)
    if only_tidb and r is not None:
        return TranslatedDDL([], "other", [])
    return TranslatedDDL(stmts + tail, kind, list(dict.fromkeys(targets)),  # all empty for an ignored table
                         alters=summary.clauses, added_columns=summary.added_columns)


def _alter_spec(tbl: TargetTable, c: Cursor, names: IndexNames) -> list[str] | None:
    """One ALTER TABLE specification. None marks a TiDB-only one, as opposed to [] for one that has nothing to
    do in PostgreSQL: a statement of TiDB-only specifications is kind "other", as on MySQL."""
    if tidb_only_spec(c.toks, c.pos, c.end):
        return None
    w = c.peek().upper
    nxt = c.peek(1).upper if c.peek(1) is not None else ""
    # partitions
    if w == "PARTITION" and nxt == "BY":
        return []
    if w in ("TRUNCATE", "DROP", "EXCHANGE") and nxt == "PARTITION":
        raise Untranslatable(f"{w} PARTITION changes rows that TiCDC does not send as row changes, and the "
                             "PostgreSQL table is not partitioned; delete the affected rows on the target by hand",
                             kind="alter_table")
    if w in ("ADD", "COALESCE", "REORGANIZE", "ANALYZE", "CHECK", "OPTIMIZE", "REBUILD", "REPAIR", "DISCARD",
             "IMPORT") and nxt in ("PARTITION", "TABLESPACE"):
        return []
    if (w == "REMOVE" and nxt == "PARTITIONING") or (w in ("FIRST", "LAST") and nxt == "PARTITION") \
            or w == "PARTITION":
        return []
    if w == "ADD":
        return _add_spec(tbl, c, names)
    if w == "DROP":
        return _drop_spec(tbl, c)
    if w in ("MODIFY", "CHANGE"):
        c.next()
        c.accept_kw("COLUMN")
        c.accept_seq("IF", "EXISTS")
        old = c.ident().ident if w == "CHANGE" else None
        col = parse_column(c)
        _skip_position(c)
        _expect_spec_end(c)
        return _modify(tbl, col, old, names)
    if w == "ALTER":
        return _alter_column_spec(tbl, c)
    if w == "RENAME":
        return _rename_spec(tbl, c)
    if w in _TABLE_OPTION_WORDS:
        return []  # table options, ALGORITHM/LOCK, CONVERT TO CHARACTER SET, ...
    raise Untranslatable(f"ALTER TABLE ... {w} is not supported", kind="alter_table")


def _add_spec(tbl: TargetTable, c: Cursor, names: IndexNames) -> list[str]:
    """ADD an index, a key or columns (a TiFlash-only index is the caller's)."""
    t = tbl.q
    c.next()
    if starts_index(c):
        idx = parse_index_def(c)
        _expect_spec_end(c)
        if idx.kind == "primary":
            if idx.has_expression:
                raise Untranslatable("a primary key on an expression", kind="alter_table")
            return [tbl.add_primary_key([p.column for p in idx.parts])]
        return tbl.index_statements(idx, names.name_for(idx))
    c.accept_kw("COLUMN")
    c.accept_seq("IF", "NOT", "EXISTS")
    if c.is_op("("):
        lo, hi = c.skip_group()
        cols = [parse_column(Cursor(c.toks, a, b)) for a, b in split_top_level(c.toks, lo, hi)]
    else:
        cols = [parse_column(c)]
        _skip_position(c)
    _expect_spec_end(c)
    out = []
    for col in cols:
        if col.generated:
            raise Untranslatable(f"adding generated column {col.name!r}: its values for existing rows are "
                                 "computed upstream and not sent", kind="alter_table")
        if col.auto_increment:
            raise Untranslatable(f"adding AUTO_INCREMENT column {col.name!r}: the values upstream assigns to "
                                 "existing rows are not sent", kind="alter_table")
        sql, temp_default = column_sql(col, for_add=True)
        out.append(f"ALTER TABLE {t} ADD COLUMN IF NOT EXISTS {sql}")
        if type_comment(col.type) is not None:
            out.append(comment_sql(tbl, col.name, col.type))
        if temp_default:
            out.append(f"ALTER TABLE {t} ALTER COLUMN {qi(col.name)} DROP DEFAULT")
        out.extend(_inline_keys(tbl, col, names))
    return out


def _drop_spec(tbl: TargetTable, c: Cursor) -> list[str]:
    """DROP the primary key, an index, a constraint or a column."""
    c.next()
    if c.accept_seq("PRIMARY", "KEY"):
        _expect_spec_end(c)
        return [tbl.drop_primary_key()]
    if c.accept_kw("INDEX", "KEY"):
        c.accept_seq("IF", "EXISTS")
        name = c.ident().ident
        _expect_spec_end(c)
        return [tbl.drop_index(name)]
    if c.accept_seq("FOREIGN", "KEY") or c.accept_kw("CHECK"):
        c.accept_seq("IF", "EXISTS")
        c.ident()
        _expect_spec_end(c)
        return []
    if c.accept_kw("CONSTRAINT"):
        c.accept_seq("IF", "EXISTS")
        name = c.ident().ident  # a CHECK, a foreign key or a unique key: drop the index if it is one
        _expect_spec_end(c)
        return [tbl.drop_index(name)]
    c.accept_kw("COLUMN")
    c.accept_seq("IF", "EXISTS")
    name = c.ident().ident
    c.accept_kw("RESTRICT", "CASCADE")
    _expect_spec_end(c)
    return [f"ALTER TABLE {tbl.q} DROP COLUMN IF EXISTS {qi(name)}"]


def _alter_column_spec(tbl: TargetTable, c: Cursor) -> list[str]:
    """ALTER [COLUMN] c SET/DROP DEFAULT; index visibility and constraint enforcement mean nothing here."""
    t = tbl.q
    c.next()
    if c.accept_kw("INDEX", "KEY", "CHECK", "CONSTRAINT"):
        return []  # visibility / enforcement
    c.accept_kw("COLUMN")
    name = c.ident().ident
    if c.accept_seq("SET", "DEFAULT"):
        d = parse_default(c)
        _expect_spec_end(c)
        sql = pg_default(d, None)
        if sql is None:
            return []
        return [f"ALTER TABLE {t} ALTER COLUMN {qi(name)} SET DEFAULT {sql}"]
    if c.accept_seq("DROP", "DEFAULT"):
        _expect_spec_end(c)
        return [f"ALTER TABLE {t} ALTER COLUMN {qi(name)} DROP DEFAULT"]
    if c.accept_kw("SET") and c.accept_kw("VISIBLE", "INVISIBLE"):
        return []
    raise LexError("unsupported ALTER COLUMN action")


def _rename_spec(tbl: TargetTable, c: Cursor) -> list[str]:
    """RENAME COLUMN or RENAME INDEX|KEY (a table rename is handled by the caller, before the table is known)."""
    c.next()
    if c.accept_kw("COLUMN"):
        a = c.ident().ident
        c.expect_kw("TO")
        b = c.ident().ident
        _expect_spec_end(c)
        return [f"ALTER TABLE {tbl.q} RENAME COLUMN {qi(a)} TO {qi(b)}"]
    c.expect_kw("INDEX", "KEY")
    a = c.ident().ident
    c.expect_kw("TO")
    b = c.ident().ident
    _expect_spec_end(c)
    out = [f"ALTER INDEX IF EXISTS {qn(tbl.schema, pg_index_name(tbl.table, a))} "
           f"RENAME TO {qi(pg_index_name(tbl.table, b))}"]
    if is_hashed(tbl.table, b):
        out.append(f"COMMENT ON INDEX {qn(tbl.schema, pg_index_name(tbl.table, b))} IS {lit(b.lower())}")
    return out


def _skip_position(c: Cursor) -> None:
    if c.accept_kw("FIRST"):
        return
    if c.accept_kw("AFTER"):
        c.ident()


def _expect_spec_end(c: Cursor) -> None:
    if not c.at_end:
        raise LexError(f"unexpected {c.peek().text!r}")


def _inline_keys(tbl: TargetTable, col: ColDef, names: IndexNames) -> list[str]:
    out = []
    if col.primary:
        out.append(tbl.add_primary_key([col.name]))
    if col.unique:
        idx = IndexDef("unique", None, [IndexPart(col.name)])
        out.extend(tbl.index_statements(idx, names.name_for(idx)))
    return out


def _modify(tbl: TargetTable, col: ColDef, old: str | None, names: IndexNames) -> list[str]:
    t = tbl.q
    c = qi(col.name)
    out = []
    if old is not None and old != col.name:
        out.append(f"ALTER TABLE {t} RENAME COLUMN {qi(old)} TO {c}")
    pgt = pg_type(col.type)
    out.append(f"ALTER TABLE {t} ALTER COLUMN {c} DROP DEFAULT")
    out.append(f"ALTER TABLE {t} ALTER COLUMN {c} TYPE {pgt} USING {c}::{pgt}")
    out.append(comment_sql(tbl, col.name, col.type))  # the new members, or no comment for other types
    if col.default is not None and not col.generated:
        d = pg_default(col.default, col.type)
        if d is not None and d != "NULL":
            out.append(f"ALTER TABLE {t} ALTER COLUMN {c} SET DEFAULT {d}")
    if col.not_null or col.primary:
        out.append(f"ALTER TABLE {t} ALTER COLUMN {c} SET NOT NULL")
    else:
        out.append(tbl.drop_not_null_unless_pk(col.name))
    out.extend(_inline_keys(tbl, col, names))
    return out
