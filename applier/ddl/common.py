"""Statement handlers both translators share: the parsing and the routing are the same for every target and
only the rendering differs, so the dialect passes a ``render`` callable.

* :func:`drop_list` (``DROP TABLE|VIEW [IF EXISTS] a, b``) and :func:`rename_tables` (``RENAME TABLE a TO b,
  c TO d``) keep the event's part of a multi-table statement (``Context.pick``, see ``applier/ddl/__init__.py``),
  route every name, and leave out the tables routing ignores;
* :func:`checked_drop_schema` refuses a DROP DATABASE that would drop more on the target than upstream.
"""

from __future__ import annotations

from typing import Callable

from applier.ddl.base import Context, TranslatedDDL
from applier.ddl.lexer import Cursor

__all__ = ["expect_end", "drop_list", "rename_tables", "checked_drop_schema"]

Name = tuple[str, str]  # (schema, table)


def expect_end(ctx: Context, c: Cursor) -> None:
    """Refuse what follows a statement that has been read: a statement half understood must not run."""
    if not c.at_end:
        ctx.fail(f"unexpected {c.peek().text!r}")


def rename_tables(ctx: Context, c: Cursor, render: Callable[[list[tuple[Name, Name]]], str | list[str]]
                  ) -> TranslatedDDL:
    """``a TO b [, c TO d]``: ``render(pairs)`` gives the target's statement(s) for the routed pairs."""
    items = _rename_pairs(ctx, c)
    chosen = ctx.pick([[new, old] for old, new in items])
    pairs: list[tuple[Name, Name]] = []
    for i in chosen:
        old, new = items[i]
        ro = ctx.routed(*old)
        rn = ctx.routed(*new)
        if ro is None and rn is None:
            continue
        if ro is None or rn is None:
            kept, ignored = (old, new) if rn is None else (new, old)
            ctx.fail(f"RENAME TABLE {'.'.join(old)} TO {'.'.join(new)} moves a table between a replicated name "
                     f"({'.'.join(kept)}) and an ignored one ({'.'.join(ignored)}); change the routing rules so "
                     "both names are replicated or both ignored", kind="rename_table")
        if ro == rn:
            continue
        pairs.append((ro, rn))
    if not pairs:
        return TranslatedDDL([], "rename_table", [])
    out = render(pairs)
    stmts = out if isinstance(out, list) else [out]
    targets = [t for a, b in pairs for t in (a, b)]
    return TranslatedDDL(stmts, "rename_table", targets)


def _rename_pairs(ctx: Context, c: Cursor) -> list[tuple[Name, Name]]:
    items = []
    while True:
        old = ctx.table_ref(c)
        c.expect_kw("TO")
        new = ctx.table_ref(c)
        items.append(((old.schema, old.table), (new.schema, new.table)))
        if not c.accept_op(","):
            break
    expect_end(ctx, c)
    return items


def drop_list(ctx: Context, c: Cursor, kind: str, render: Callable[[list[Name]], str]) -> TranslatedDDL:
    """``[IF EXISTS] a, b [RESTRICT|CASCADE]``: ``render(names)`` gives the target's statement for the routed
    names; IF EXISTS is the renderer's to add, so replays stay harmless."""
    c.accept_seq("IF", "EXISTS")
    refs = [ctx.table_ref(c)]
    while c.accept_op(","):
        refs.append(ctx.table_ref(c))
    c.accept_kw("RESTRICT", "CASCADE")
    expect_end(ctx, c)
    chosen = ctx.pick([[(r.schema, r.table)] for r in refs])
    routed = [ctx.routed(refs[i].schema, refs[i].table) for i in chosen]
    kept = list(dict.fromkeys(r for r in routed if r is not None))
    if not kept:
        return TranslatedDDL([], kind, [])
    return TranslatedDDL([render(kept)], kind, kept)


def checked_drop_schema(ctx: Context, name: str, system: frozenset[str]) -> str | None:
    """The routed schema to drop, or None when routing ignores it. Refused when the target schema is a system
    schema, or when routing renames it (the target schema may hold tables of other upstream schemas)."""
    target = ctx.routed_schema(name)
    if target is None:
        return None
    if target.lower() in system:
        ctx.fail(f"dropping the target schema {target!r} is refused (a system schema)", kind="drop_schema")
    if target != name:
        ctx.fail(f"DROP DATABASE {name}: routing maps it to target schema {target!r}, which may also hold "
                 "tables of other upstream schemas; drop the tables or schema on the target by hand",
                 kind="drop_schema")
    return target
