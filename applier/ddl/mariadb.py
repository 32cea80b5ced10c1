"""What MariaDB 10.x/11.x spells or lacks differently from MySQL 8, applied to a statement being rewritten for a
``"mariadb"`` target (see ``applier/ddl/mysql.py`` for where each is used).

* the MySQL 8 collations ``utf8mb4_0900_ai_ci`` -> ``utf8mb4_unicode_520_ci`` and ``utf8mb4_0900_bin`` ->
  ``utf8mb4_bin`` (nearest equivalents; MariaDB before 11.4 has no 0900 collations);
* index visibility ``INVISIBLE``/``VISIBLE`` -> ``IGNORED``/``NOT IGNORED``;
* functional key parts ``((a + b))``: MariaDB has none, so such an index is left out when non-unique (it only
  speeds up queries) and refused when unique;
* a primary key over a generated column, which MariaDB forbids (TiDB allows it): refused.
"""

from __future__ import annotations

from typing import Sequence

from applier.ddl.base import Context
from applier.ddl.lexer import Cursor, Token, split_top_level
from applier.ddl.rewrite import Rewrite
from applier.ddl.syntax import parse_column, parse_index_def, starts_index

__all__ = ["mariadb_collations", "mariadb_visibility", "expression_key", "mariadb_create_table_checks"]

_MARIADB_COLLATIONS = {
    "utf8mb4_0900_ai_ci": "utf8mb4_unicode_520_ci",
    "utf8mb4_0900_bin": "utf8mb4_bin",
}


def mariadb_collations(st: Rewrite) -> None:
    """Every ``COLLATE x`` of the statement: MariaDB would refuse the whole statement over one 0900 name."""
    sig = st.sig
    for i, t in enumerate(sig):
        if not t.is_word("COLLATE"):
            continue
        j = i + 1
        if j < len(sig) and sig[j].is_op("="):
            j += 1
        if j < len(sig) and sig[j].kind in ("word", "qident", "string"):
            name = sig[j].ident if sig[j].kind != "string" else sig[j].value
            mapped = _MARIADB_COLLATIONS.get(name.lower())
            if mapped:
                st.replace(sig[j].start, sig[j].end, mapped)


def mariadb_visibility(st: Rewrite, lo: int, hi: int) -> None:
    """The index options in sig[lo:hi]; depth 0 only, so a column or expression named ``visible`` survives."""
    depth = 0
    for i in range(lo, hi):
        t = st.sig[i]
        if t.is_op("("):
            depth += 1
        elif t.is_op(")"):
            depth -= 1
        elif depth == 0 and t.is_word("INVISIBLE"):
            st.replace(t.start, t.end, "IGNORED")
        elif depth == 0 and t.is_word("VISIBLE"):
            st.replace(t.start, t.end, "NOT IGNORED")


def expression_key(sig: Sequence[Token], lo: int, hi: int, ctx: Context, unique: bool | None = None) -> bool:
    """MariaDB (10.x/11.x) has no functional key parts: True when the index in sig[lo:hi] has one (a
    non-unique one is then left out: it only speeds up queries); a unique one is refused."""
    i = lo
    while i < hi and not sig[i].is_op("("):
        i += 1
    if i >= hi:
        return False
    close = Cursor(sig, i, hi).matching()
    if not any(sig[a].is_op("(") for a, b in split_top_level(sig, i + 1, close) if a < b):
        return False
    if unique is None:
        unique = any(t.is_word("UNIQUE", "PRIMARY") for t in sig[lo:i])
    if unique:
        ctx.fail("MariaDB has no functional key parts, so this unique index on an expression cannot be "
                 "created", kind="create_index")
    return True


def mariadb_create_table_checks(ctx: Context, st: Rewrite, elements: list[tuple[int, int]]) -> None:
    """MariaDB refuses a primary key over a generated column (TiDB allows it)."""
    generated: set[str] = set()
    pk: set[str] = set()
    for a, b in elements:
        ec = Cursor(st.sig, a, b)
        try:
            if starts_index(ec):
                idx = parse_index_def(ec)
                if idx.kind == "primary":
                    pk.update(p.column.lower() for p in idx.parts if p.column)
            else:
                col = parse_column(ec)
                if col.generated:
                    generated.add(col.name.lower())
                if col.primary:
                    pk.add(col.name.lower())
        except Exception:  # the MySQL text passes through; let the server judge what we cannot parse
            continue
    both = sorted(generated & pk)
    if both:
        ctx.fail(f"MariaDB cannot put a primary key on generated column(s) {', '.join(both)}; create the table "
                 "on the target by hand (for example with a plain column)", kind="create_table")
