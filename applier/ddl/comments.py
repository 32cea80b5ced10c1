"""Comments in a replicated DDL: none reaches the target.

A comment in a DDL is either nothing to MySQL/TiDB, or something a server runs: MySQL's executable comments
``/*! ... */`` and ``/*!50100 ... */`` (TiDB runs their content too, whatever the version number), MariaDB's
``/*M! ... */`` (MariaDB's own: MariaDB runs it, MySQL does not), TiDB's ``/*T![feature] ... */`` (removed before
this by ``applier/ddl/tidb.py``). Which server runs which comment, at which version number, and where its content
ends (a ``*/`` inside a string) is decided by each server's own lexer; passing one on means the target may run
text the translator never read as the statement, or read it differently, with the translator's own edits inside
(a routed name, an ``IF EXISTS``). So :func:`strip_comments` rebuilds the statement without any comment, and an
executable comment's content becomes plain syntax, is dropped, or refuses the DDL:

* ``/* ... */``, ``-- ...``, ``# ...``, ``/*+ hints */``: removed (a token separator to every server).
* ``/*M! ... */`` (MariaDB's executable comment): removed with a warning (MySQL syntax has no such comment).
* ``/*!NNNNN ... */`` holding ``[DEFAULT] CHARACTER SET|CHARSET|COLLATE [=] x`` or ``IF [NOT] EXISTS``: the
  comment around them is removed with a warning and they stay as plain syntax: TiDB ran them, and dropping a
  collation would change which values the target accepts and which keys are equal.
* ``/*!NNNNN ... */`` holding storage and table options (``ENGINE``, ``TABLESPACE``, ``STORAGE``, ``ENCRYPTION``,
  ``ROW_FORMAT``, ``KEY_BLOCK_SIZE``, ``STATS_*``, ``COMMENT``, ``AUTO_INCREMENT``, ``INVISIBLE``, ...): removed
  with a warning. They do not change which rows the target holds or accepts; the target's own settings apply (and
  a tablespace, engine or encryption the target lacks would refuse the DDL).
* anything else in ``/*! ... */`` (``PARTITION BY``, a clause, a comma, a second statement, a comment in it): the
  DDL is refused (:class:`Untranslatable`, so ``[target] on_unsupported_ddl`` decides: stop, or skip with a
  record).

The options are read from the comment's tokens, one option name and one value token at a time, so a comment can
never carry a clause, a name or a statement to the target (invariant 11): what reaches it is only what the
translator parsed as the statement.
"""

from __future__ import annotations

from typing import Sequence

from applier.ddl.base import Untranslatable, shorten
from applier.ddl.lexer import Token, tokenize

__all__ = ["strip_comments"]

# options TiDB and MySQL run, that the target gets as plain syntax: they decide which values a column accepts and
# which keys are equal (a character set, a collation), or only make the statement idempotent
_KEEP_VALUED = frozenset({"CHARSET", "COLLATE"})
# options that change how the target stores a table, never which rows it holds: dropped (the target's defaults)
_DROP_VALUED = frozenset({
    "ENGINE", "TABLESPACE", "STORAGE", "ENCRYPTION", "ROW_FORMAT", "KEY_BLOCK_SIZE", "COMPRESSION",
    "STATS_PERSISTENT", "STATS_AUTO_RECALC", "STATS_SAMPLE_PAGES", "PACK_KEYS", "CHECKSUM", "TABLE_CHECKSUM",
    "DELAY_KEY_WRITE", "AVG_ROW_LENGTH", "MAX_ROWS", "MIN_ROWS", "AUTOEXTEND_SIZE", "SECONDARY_ENGINE",
    "ENGINE_ATTRIBUTE", "SECONDARY_ENGINE_ATTRIBUTE", "AUTO_INCREMENT", "COMMENT", "PAGE_CHECKSUM",
    "PAGE_COMPRESSED", "PAGE_COMPRESSION_LEVEL", "TRANSACTIONAL", "ENCRYPTION_KEY_ID", "ENCRYPTED",
})
_DROP_BARE = frozenset({"INVISIBLE", "VISIBLE"})
_VALUE_KINDS = frozenset({"word", "qident", "string", "number", "hexnum"})


def strip_comments(query: str) -> tuple[str, list[str]]:
    """``query`` without comments (see the module docstring), and a warning for each executable comment whose
    content was dropped. Raises :class:`Untranslatable` for an executable comment that holds anything but the
    options above, and :class:`~applier.ddl.lexer.LexError` when the query cannot be tokenised."""
    toks = tokenize(query)
    if not any(t.kind in ("comment", "tidb_comment", "vopen") for t in toks):
        return query, []
    out: list[str] = []
    notes: list[str] = []
    i, n = 0, len(toks)

    def separate(text: str) -> None:
        """Put ``text`` where a comment was: comments separate tokens, so keep one space on each side."""
        if out and not out[-1][-1:].isspace():
            out.append(" ")
        if text:
            out.append(text)
            if i < n and toks[i].kind != "ws":
                out.append(" ")

    while i < n:
        t = toks[i]
        if t.kind in ("comment", "tidb_comment"):
            if t.text.startswith("/*M!"):
                notes.append(f"dropped the MariaDB executable comment {shorten(t.text, 120)!r}: it is not MySQL "
                             "syntax, and no comment of a replicated DDL reaches the target")
            i += 1
            separate("")
            if out and out[-1][-1:].isspace() and i < n and toks[i].kind == "ws":
                i += 1  # one separator is enough
            continue
        if t.kind == "vopen":
            j = next((k for k in range(i + 1, n) if toks[k].kind == "vclose"), n)
            whole = "".join(x.text for x in toks[i:j + 1])
            kept, dropped = _options(toks[i + 1:j], whole)
            if dropped:
                rest = f"; {' '.join(kept)} kept as plain syntax" if kept else ""
                notes.append(f"dropped the executable comment {shorten(whole, 120)!r}: its options "
                             f"({', '.join(dropped)}) do not change which rows the target holds or accepts, and the "
                             f"target's own settings apply{rest}")
            elif kept:
                notes.append(f"removed the executable comment {shorten(whole, 120)!r} around {' '.join(kept)!r}, "
                             "kept as plain syntax (TiDB ran it as part of the statement)")
            i = j + 1
            separate(" ".join(kept))
            if out and out[-1][-1:].isspace() and i < n and toks[i].kind == "ws":
                i += 1
            continue
        out.append(t.text)
        i += 1
    return "".join(out), notes


def _options(content: Sequence[Token], whole: str) -> tuple[list[str], list[str]]:
    """The options of an executable comment's content: (the kept ones as text, the names of the dropped ones).
    Anything but a sequence of known options, with at most one comma between two, refuses the DDL."""

    def refuse(why: str) -> None:
        raise Untranslatable(
            f"the executable comment {shorten(whole, 120)!r} {why}: MySQL and TiDB run its content as part of the "
            "statement, so it can be neither dropped nor passed on; write the statement without the comment")

    if any(t.kind in ("comment", "tidb_comment", "vopen") for t in content):
        refuse("holds another comment")
    sig = [t for t in content if t.kind != "ws"]
    kept: list[str] = []
    dropped: list[str] = []
    k, m = 0, len(sig)

    def value(at: int) -> int:
        """Index after ``[=] value`` at ``at``."""
        if at < m and sig[at].is_op("="):
            at += 1
        if at >= m or sig[at].kind not in _VALUE_KINDS:
            refuse("holds an option without a value")
        return at + 1

    while k < m:
        if sig[k].is_op(",") and (kept or dropped) and k + 1 < m:
            k += 1
        start = k
        w = sig[k].upper
        if w == "DEFAULT" and k + 1 < m and sig[k + 1].upper in ("CHARACTER", "CHARSET", "COLLATE", "ENCRYPTION"):
            k += 1
            w = sig[k].upper
        if w == "CHARACTER" and k + 1 < m and sig[k + 1].is_word("SET"):
            k = value(k + 2)
            kept.append(" ".join(t.text for t in sig[start:k]))
        elif w in _KEEP_VALUED:
            k = value(k + 1)
            kept.append(" ".join(t.text for t in sig[start:k]))
        elif w == "IF" and k + 2 < m and sig[k + 1].is_word("NOT") and sig[k + 2].is_word("EXISTS"):
            k += 3
            kept.append("IF NOT EXISTS")
        elif w == "IF" and k + 1 < m and sig[k + 1].is_word("EXISTS"):
            k += 2
            kept.append("IF EXISTS")
        elif w in _DROP_BARE:
            k += 1
            dropped.append(w)
        elif w in ("DATA", "INDEX") and k + 1 < m and sig[k + 1].is_word("DIRECTORY"):
            k = value(k + 2)
            dropped.append(f"{w} DIRECTORY")
        elif w in _DROP_VALUED:
            k = value(k + 1)
            if w == "TABLESPACE" and k < m and sig[k].is_word("STORAGE"):
                k = value(k + 1)
            dropped.append(w)
        else:
            what = sig[k].text
            refuse(f"holds {shorten(what, 40)!r}, which is not a table, database, index or column option the "
                   "applier can drop or keep")
    return kept, dropped
