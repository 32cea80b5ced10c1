"""The PostgreSQL statements that touch one routed table's indexes and keys: CREATE INDEX from a MySQL index,
the primary key, column comments, and the DO blocks that rename or copy a table's indexes (RENAME TABLE,
CREATE TABLE .. LIKE).

Index names follow ``applier/ddl/pg_sql.py``; unnamed MySQL indexes get MySQL's name (:class:`IndexNames`) so
that a later ``DROP INDEX`` finds them.
"""

from __future__ import annotations

from typing import Sequence

from applier.ddl.base import Untranslatable
from applier.ddl.pg_sql import do_block, index_name_sql, is_hashed, lit, pg_index_name, qi, qn
from applier.ddl.pg_types import type_comment
from applier.ddl.syntax import IndexDef, IndexPart, MyType

__all__ = ["TargetTable", "IndexNames", "comment_sql", "copy_indexes_block", "rename_table_statements"]


class IndexNames:
    """MySQL's naming of unnamed indexes within one table: first column, then _2, _3, ..."""

    def __init__(self, taken: Sequence[str] = ()) -> None:
        self.taken = {n.lower() for n in taken}

    def name_for(self, idx: IndexDef) -> str:
        if idx.kind == "primary":
            return "PRIMARY"
        if idx.name:
            self.taken.add(idx.name.lower())
            return idx.name
        base = next((p.column for p in idx.parts if p.column), None) or "expression_index"
        name = base
        n = 2
        while name.lower() in self.taken or name.upper() == "PRIMARY":
            name = f"{base}_{n}"
            n += 1
        self.taken.add(name.lower())
        return name


class TargetTable:
    """A routed target table and the statements that touch it."""

    def __init__(self, schema: str, table: str) -> None:
        self.schema = schema
        self.table = table
        self.q = qn(schema, table)

    def index_statements(self, idx: IndexDef, name: str, types: dict[str, MyType] | None = None) -> list[str]:
        """CREATE INDEX for a MySQL index; ``types`` (lower-cased column name -> type) when known."""
        if idx.kind in ("foreign", "check", "fulltext", "spatial", "vector", "columnar"):
            return []
        if idx.has_expression:
            if idx.kind in ("unique", "primary"):
                raise Untranslatable(f"unique index {name!r} on an expression: MySQL expressions cannot be "
                                     "translated reliably", kind="create_index")
            return []  # a non-unique expression index only speeds up queries
        rendered = [_part_sql(p, types) for p in idx.parts]
        cols = ", ".join(rendered)
        if idx.kind == "primary":
            return [self.add_primary_key([p.column for p in idx.parts])]
        pg_name = pg_index_name(self.table, name)
        # a unique prefix over a long column becomes a plain index: upstream enforces the uniqueness, and the
        # writers (which order unique-key swaps by the unique indexes they can see) cannot see expressions
        unique = "UNIQUE " if idx.kind == "unique" and not any(r.startswith("(") for r in rendered) else ""
        out = [f"CREATE {unique}INDEX IF NOT EXISTS {qi(pg_name)} ON {self.q} ({cols})"]
        if is_hashed(self.table, name):
            out.append(f"COMMENT ON INDEX {qn(self.schema, pg_name)} IS {lit(name.lower())}")
        return out

    def add_primary_key(self, columns: Sequence[str]) -> str:
        cols = ", ".join(qi(c) for c in columns)
        return do_block(
            "BEGIN\n"
            f"  IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass({lit(self.q)}) "
            "AND indisprimary) THEN\n"
            f"    ALTER TABLE {self.q} ADD CONSTRAINT {qi(pg_index_name(self.table, 'PRIMARY'))} "
            f"PRIMARY KEY ({cols});\n"
            "  END IF;\n"
            "END;"
        )

    def drop_primary_key(self) -> str:
        return f"ALTER TABLE {self.q} DROP CONSTRAINT IF EXISTS {qi(pg_index_name(self.table, 'PRIMARY'))}"

    def drop_index(self, name: str) -> str:
        if name.upper() == "PRIMARY":
            return self.drop_primary_key()
        return f"DROP INDEX IF EXISTS {qn(self.schema, pg_index_name(self.table, name))}"

    def drop_not_null_unless_pk(self, column: str) -> str:
        return do_block(
            "BEGIN\n"
            "  IF NOT EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid "
            "AND a.attnum = ANY (i.indkey)\n"
            f"                 WHERE i.indrelid = to_regclass({lit(self.q)}) AND i.indisprimary "
            f"AND a.attname = {lit(column)}) THEN\n"
            f"    ALTER TABLE {self.q} ALTER COLUMN {qi(column)} DROP NOT NULL;\n"
            "  END IF;\n"
            "END;"
        )


_SHORT_CHARS = 512  # varchar(n) up to this many characters (4 bytes each) fits a btree entry (~2700 bytes)
_SHORT_BYTES = 2000


def _part_sql(p: IndexPart, types: dict[str, MyType] | None) -> str:
    """One key part. A MySQL prefix ``col(n)`` is dropped when the column is known to be short; otherwise
    the index covers ``substring(col from 1 for n)``: the same prefix semantics (also for UNIQUE), and
    a long TEXT/BLOB value cannot exceed PostgreSQL's btree entry limit and stop replication."""
    col = qi(p.column)
    if p.prefix is not None:
        t = types.get(p.column.lower()) if types else None
        n = int(float(t.args[0])) if t is not None and t.args else 1
        short = t is not None and (
            (t.name in ("char", "varchar") and t.charset != "binary" and n <= _SHORT_CHARS)
            or (t.name in ("binary", "varbinary") and n <= _SHORT_BYTES))
        if not short:
            col = f"(substring({col} from 1 for {p.prefix}))"
    return col + (" DESC" if p.desc else "")


def rename_indexes_block(schema: str, old_table: str, new_table: str) -> str:
    """Rename the indexes of (already renamed) table schema.new_table from old_table's names to new_table's."""
    reg = lit(qn(schema, new_table))
    prefix = old_table + "__"
    return do_block(
        "DECLARE\n  r record;\n  v_my text;\n  v_new text;\n"
        "BEGIN\n"
        "  FOR r IN SELECT c.relname::text AS relname, i.indisprimary, obj_description(c.oid, 'pg_class') AS note\n"
        "           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid\n"
        f"           WHERE i.indrelid = to_regclass({reg})\n"
        "  LOOP\n"
        "    IF r.indisprimary THEN\n"
        f"      v_new := {lit(pg_index_name(new_table, 'PRIMARY'))};\n"
        "    ELSE\n"
        f"      IF left(r.relname, {len(prefix)}) = {lit(prefix)} THEN\n"
        f"        v_my := substr(r.relname, {len(prefix) + 1});\n"
        "      ELSE\n"
        "        v_my := r.note;\n"
        "      END IF;\n"
        "      CONTINUE WHEN v_my IS NULL;\n"
        f"      v_new := {index_name_sql(new_table, 'v_my')};\n"
        f"      IF v_new <> {lit(new_table + '__')} || v_my THEN\n"
        f"        EXECUTE format('COMMENT ON INDEX %I.%I IS %L', {lit(schema)}, r.relname, v_my);\n"
        "      END IF;\n"
        "    END IF;\n"
        "    IF v_new <> r.relname THEN\n"
        f"      EXECUTE format('ALTER INDEX %I.%I RENAME TO %I', {lit(schema)}, r.relname, v_new);\n"
        "    END IF;\n"
        "  END LOOP;\n"
        "END;"
    )


def copy_indexes_block(src: TargetTable, dst: TargetTable) -> str:
    """CREATE TABLE .. LIKE: give dst the primary key and indexes of src, under dst's index names."""
    prefix = src.table + "__"
    return do_block(
        "DECLARE\n  r record;\n  v_cols text;\n  v_my text;\n  v_new text;\n"
        "BEGIN\n"
        "  FOR r IN SELECT i.indexrelid, i.indisprimary, i.indisunique, i.indnkeyatts, c.relname::text AS relname,\n"
        "                  obj_description(c.oid, 'pg_class') AS note\n"
        "           FROM pg_index i JOIN pg_class c ON c.oid = i.indexrelid\n"
        f"           WHERE i.indrelid = to_regclass({lit(src.q)})\n"
        "  LOOP\n"
        "    SELECT string_agg(pg_get_indexdef(r.indexrelid, k, true), ', ' ORDER BY k) INTO v_cols\n"
        "      FROM generate_series(1, r.indnkeyatts) AS k;\n"
        "    IF r.indisprimary THEN\n"
        f"      IF NOT EXISTS (SELECT 1 FROM pg_index WHERE indrelid = to_regclass({lit(dst.q)}) "
        "AND indisprimary) THEN\n"
        f"        EXECUTE format('ALTER TABLE %s ADD CONSTRAINT %I PRIMARY KEY (%s)', {lit(dst.q)}, "
        f"{lit(pg_index_name(dst.table, 'PRIMARY'))}, v_cols);\n"
        "      END IF;\n"
        "      CONTINUE;\n"
        "    END IF;\n"
        f"    IF left(r.relname, {len(prefix)}) = {lit(prefix)} THEN\n"
        f"      v_my := substr(r.relname, {len(prefix) + 1});\n"
        "    ELSE\n"
        "      v_my := r.note;\n"
        "    END IF;\n"
        "    CONTINUE WHEN v_my IS NULL;\n"
        f"    v_new := {index_name_sql(dst.table, 'v_my')};\n"
        "    EXECUTE format('CREATE %sINDEX IF NOT EXISTS %I ON %s (%s)', "
        f"CASE WHEN r.indisunique THEN 'UNIQUE ' ELSE '' END, v_new, {lit(dst.q)}, v_cols);\n"
        f"    IF v_new <> {lit(dst.table + '__')} || v_my THEN\n"
        f"      EXECUTE format('COMMENT ON INDEX %I.%I IS %L', {lit(dst.schema)}, v_new, v_my);\n"
        "    END IF;\n"
        "  END LOOP;\n"
        "END;"
    )


def rename_table_statements(old: tuple[str, str], new: tuple[str, str]) -> list[str]:
    """RENAME TABLE old TO new: PostgreSQL renames and moves a table in separate statements, and the indexes
    must follow the new table name (their names derive from it)."""
    (s1, a), (s2, b) = old, new
    out = []
    if a != b:
        out.append(f"ALTER TABLE IF EXISTS {qn(s1, a)} RENAME TO {qi(b)}")
    if s1 != s2:
        out.append(f"ALTER TABLE IF EXISTS {qn(s1, b)} SET SCHEMA {qi(s2)}")
    if a != b:
        out.append(rename_indexes_block(s2, a, b))
    return out


def comment_sql(tbl: TargetTable, column: str, t: MyType | None) -> str:
    """COMMENT ON COLUMN recording ``t``'s members (or clearing the comment when ``t`` needs none)."""
    note = type_comment(t) if t is not None else None
    return f"COMMENT ON COLUMN {tbl.q}.{qi(column)} IS {lit(note) if note is not None else 'NULL'}"
