"""TiDB-only syntax, shared by both target dialects: removed from a statement, or the whole statement
recognised as having no meaning (or no faithful replay) outside TiDB.

:func:`neutralise_tidb` removes the syntax that only TiDB understands, working on tokens so that string
literals and quoted identifiers that happen to contain those words are never touched:

====================================================  ==================================================
TiDB syntax                                           what happens
====================================================  ==================================================
``/*T![clustered_index] CLUSTERED */``, every         removed (TiDB feature comments are comments to
``/*T![...] ... */`` and ``/*T! ... */``               MySQL anyway; their content is TiDB-only)
``AUTO_RANDOM`` / ``AUTO_RANDOM(5)`` / ``(5, 54)``    removed, the column keeps its BIGINT type
``CLUSTERED`` / ``NONCLUSTERED`` after a primary key  removed
``GLOBAL`` / ``LOCAL`` after an index's column list   removed (TiDB global indexes on partitioned tables)
table options ``AUTO_ID_CACHE``,                      removed with their value and one separating comma
``AUTO_RANDOM_BASE``, ``SHARD_ROW_ID_BITS``,
``PRE_SPLIT_REGIONS``, ``TTL = col + INTERVAL n U``,
``TTL_ENABLE``, ``TTL_JOB_INTERVAL``,
``STATS_BUCKETS``/``STATS_TOPN``/``STATS_COL_CHOICE``
/``STATS_COL_LIST``/``STATS_SAMPLE_RATE``,
``[DEFAULT] PLACEMENT POLICY [=] p``,
``REMOVE TTL`` (ALTER TABLE)
``/*!40101 ... */`` (MySQL versioned comments)        kept here (MySQL syntax); ``applier/ddl/comments.py``
                                                      then keeps, drops or refuses their content
====================================================  ==================================================

Bare keywords are removed only inside CREATE TABLE / ALTER TABLE / CREATE INDEX / CREATE|ALTER DATABASE
statements and only in the position where TiDB accepts them (table options at the top level and followed by
``=`` or a value), so a column named ``ttl`` or ``clustered`` survives. :func:`tidb_only_statement` names the
statements that have no meaning outside TiDB (see ``applier/ddl/mysql.py`` for the table),
:func:`tidb_only_spec` the ALTER TABLE specifications that have none (every translator, and the clause summary of
``applier/ddl/syntax.py``, leaves them out through it, so they agree on what an ALTER does downstream), and
:func:`restores_data_statement` those (RECOVER, FLASHBACK) that bring back data TiCDC does not resend.
"""

from __future__ import annotations

from typing import Sequence

from applier.ddl.lexer import INSIGNIFICANT, Cursor, Token, tokenize

__all__ = ["neutralise_tidb", "tidb_only_statement", "tidb_only_spec", "restores_data_statement"]

_TABLE_OPTIONS_NUM = {"AUTO_ID_CACHE", "AUTO_RANDOM_BASE", "SHARD_ROW_ID_BITS", "PRE_SPLIT_REGIONS",
                      "STATS_BUCKETS", "STATS_TOPN", "STATS_SAMPLE_RATE"}
_TABLE_OPTIONS_STR = {"TTL_ENABLE", "TTL_JOB_INTERVAL", "STATS_COL_CHOICE", "STATS_COL_LIST"}
_VALUE_KINDS = {"number", "string", "word", "qident", "hexnum"}


def _statement_allows_keyword_removal(sig: Sequence[Token]) -> bool:
    c = Cursor(sig)
    if c.accept_kw("CREATE"):
        c.accept_seq("OR", "REPLACE")
        c.accept_kw("GLOBAL", "LOCAL")
        c.accept_kw("TEMPORARY")
        c.accept_kw("UNIQUE", "FULLTEXT", "SPATIAL", "VECTOR", "COLUMNAR")
        return c.is_kw("TABLE", "INDEX", "KEY", "DATABASE", "SCHEMA")
    if c.accept_kw("ALTER"):
        c.accept_kw("ONLINE", "OFFLINE")
        c.accept_kw("IGNORE")
        return c.is_kw("TABLE", "DATABASE", "SCHEMA")
    return False


def _remove_spans(toks: Sequence[Token], remove: set[int]) -> str:
    """Rebuild the text without the tokens whose indexes are in ``remove``, keeping neighbours apart."""
    out: list[str] = []
    i = 0
    n = len(toks)
    while i < n:
        if i not in remove:
            out.append(toks[i].text)
            i += 1
            continue
        j = i
        while j < n and (j in remove or (toks[j].kind == "ws" and j + 1 < n and (j + 1) in remove)):
            j += 1
        # toks[i:j] disappear (with the whitespace between removed tokens)
        before = out[-1] if out else ""
        after = toks[j] if j < n else None
        if before and before[-1:].isspace() and (after is None or after.kind == "ws"
                                                  or after.is_op(",", ")", ";")):
            out[-1] = before.rstrip(" \t")
            if after is not None and after.kind == "ws" and not out[-1]:
                out.pop()
        elif before and not before[-1:].isspace() and after is not None and after.kind != "ws" \
                and not after.is_op(",", ")", ";"):
            out.append(" ")
        i = j
    return "".join(out)


def neutralise_tidb(query: str) -> str:
    """Return ``query`` without TiDB-only syntax (see the module docstring); everything else is kept verbatim.

    Raises :class:`LexError` when the query cannot be tokenised.
    """
    toks = tokenize(query)
    remove: set[int] = {i for i, t in enumerate(toks) if t.kind == "tidb_comment"}
    sig_idx = [i for i, t in enumerate(toks) if t.kind not in INSIGNIFICANT]
    sig = [toks[i] for i in sig_idx]
    if not sig or not _statement_allows_keyword_removal(sig):
        return _remove_spans(toks, remove) if remove else query

    depth_at: list[int] = []
    depth = 0
    for t in sig:
        if t.is_op(")"):
            depth -= 1
        depth_at.append(depth)
        if t.is_op("("):
            depth += 1

    drop: set[int] = set()  # indexes into sig

    def drop_option(lo: int, hi: int) -> None:
        """Drop sig[lo:hi], a top-level option, plus one separating comma."""
        drop.update(range(lo, hi))
        p = lo - 1
        while p >= 0 and p in drop:
            p -= 1
        if p >= 0 and sig[p].is_op(",") and depth_at[p] == depth_at[lo]:
            drop.add(p)
        elif hi < len(sig) and sig[hi].is_op(",") and depth_at[hi] == depth_at[lo]:
            drop.add(hi)

    def value_end(k: int) -> int | None:
        """sig[k] starts ``[=] value``; return the index after the value."""
        if k < len(sig) and sig[k].is_op("="):
            k += 1
        if k < len(sig) and (sig[k].kind in _VALUE_KINDS):
            return k + 1
        return None

    k = 0
    n = len(sig)
    while k < n:
        t = sig[k]
        prev = sig[k - 1] if k > 0 else None
        nxt = sig[k + 1] if k + 1 < n else None
        w = t.upper
        if t.kind != "word" or k in drop:
            k += 1
            continue
        if w == "AUTO_RANDOM" and prev is not None and not prev.is_op("(", ",", "."):
            hi = k + 1
            if nxt is not None and nxt.is_op("("):
                hi = Cursor(sig).matching(k + 1) + 1
            drop.update(range(k, hi))
            k = hi
            continue
        if w in ("CLUSTERED", "NONCLUSTERED") and prev is not None and (prev.is_word("KEY") or prev.is_op(")")):
            drop.add(k)
        elif w in ("GLOBAL", "LOCAL") and prev is not None and prev.is_op(")") and (
                nxt is None or nxt.is_op(",", ")", ";") or nxt.is_word("COMMENT", "VISIBLE", "INVISIBLE")):
            drop.add(k)
        elif w == "PLACEMENT" and nxt is not None and nxt.is_word("POLICY"):
            lo = k - 1 if prev is not None and prev.is_word("DEFAULT") else k
            hi = value_end(k + 2)
            if hi is not None:
                if depth_at[k] == 0:
                    drop_option(lo, hi)
                else:
                    drop.update(range(lo, hi))
                k = hi
                continue
        elif depth_at[k] == 0 and (w in _TABLE_OPTIONS_NUM or w in _TABLE_OPTIONS_STR) \
                and prev is not None and not prev.is_word("COLUMN", "ADD", "DROP", "MODIFY", "CHANGE", "ALTER"):
            hi = value_end(k + 1)
            if hi is not None and (nxt.is_op("=") or sig[k + 1].kind in ("number", "string")):
                drop_option(k, hi)
                k = hi
                continue
        elif w == "REMOVE" and depth_at[k] == 0 and nxt is not None and nxt.is_word("TTL"):
            drop_option(k, k + 2)
            k += 2
            continue
        elif w == "TTL" and depth_at[k] == 0 and prev is not None \
                and not prev.is_word("COLUMN", "ADD", "DROP", "MODIFY", "CHANGE", "ALTER"):
            hi = _ttl_expression_end(sig, k + 1)
            if hi is not None:
                drop_option(k, hi)
                k = hi
                continue
        k += 1

    remove.update(sig_idx[i] for i in drop)
    return _remove_spans(toks, remove) if remove else query


def _ttl_expression_end(sig: Sequence[Token], k: int) -> int | None:
    """``[=] col + INTERVAL value unit``: return the index after it, or None if it does not look like that."""
    n = len(sig)
    if k < n and sig[k].is_op("="):
        k += 1
    if k >= n or not sig[k].is_ident:
        return None
    k += 1
    while k + 1 < n and sig[k].is_op(".") and sig[k + 1].is_ident:
        k += 2
    if not (k + 1 < n and sig[k].is_op("+") and sig[k + 1].is_word("INTERVAL")):
        return None
    k += 2
    if k < n and sig[k].is_op("("):
        k = Cursor(sig).matching(k) + 1
    elif k < n and sig[k].kind in ("number", "string"):
        k += 1
    else:
        return None
    if k < n and sig[k].kind == "word":
        return k + 1
    return None


# ---------------------------------------------------------------------------------------------------------
# Statements with no meaning outside TiDB


def tidb_only_statement(sig: Sequence[Token]) -> str | None:
    """If the statement only concerns TiDB (nothing to do on MySQL/MariaDB/PostgreSQL), say what it is."""
    c = Cursor(sig)
    first = c.peek()
    if first is None:
        return None
    w = first.upper
    if w in ("ADMIN", "ANALYZE", "SPLIT", "BATCH", "TRACE", "PLAN", "CALIBRATE", "IMPORT", "BACKUP", "RESTORE",
             "LOAD", "QUERY", "CANCEL", "PAUSE", "RESUME"):
        # LOAD STATS, QUERY WATCH, CANCEL/PAUSE/RESUME (IMPORT|DDL) JOB, ...
        if w == "LOAD" and not c.is_kw("STATS", k=1):
            return None
        return f"TiDB {w} statement"
    if w in ("CREATE", "ALTER", "DROP"):
        c.next()
        c.accept_seq("OR", "REPLACE")
        if c.is_kw("SEQUENCE"):
            return f"{w} SEQUENCE (TiDB sequences are not replicated as data)"
        if c.is_kw("PLACEMENT") and c.is_kw("POLICY", k=1):
            return f"{w} PLACEMENT POLICY"
        if c.is_kw("RESOURCE") and c.is_kw("GROUP", k=1):
            return f"{w} RESOURCE GROUP"
        if c.accept_kw("GLOBAL", "SESSION"):
            if c.is_kw("BINDING"):
                return f"{w} BINDING"
        if c.is_kw("BINDING"):
            return f"{w} BINDING"
        if c.is_kw("STATISTICS"):
            return f"{w} STATISTICS"
    if w == "ALTER":
        c = Cursor(sig, 1)
        if c.accept_kw("DATABASE", "SCHEMA"):
            if c.peek() is not None and c.peek().is_ident and not c.is_kw("SET", "DEFAULT", "CHARACTER",
                                                                           "CHARSET", "COLLATE"):
                c.next()
            if c.is_kw("SET") and c.is_kw("TIFLASH", k=1):
                return "ALTER DATABASE ... SET TIFLASH REPLICA"
        if c.is_kw("INSTANCE"):
            return "ALTER INSTANCE"
    if w in ("LOCK", "UNLOCK") and c.is_kw("STATS", k=1):
        return f"{w} STATS"
    return None


def tidb_only_spec(sig: Sequence[Token], lo: int, hi: int) -> bool:
    """Is sig[lo:hi], one ALTER TABLE specification, meaningful only to TiDB: TiFlash replicas and indexes, cached
    tables, compaction, region attributes, extended statistics, a partition's placement (its ``PLACEMENT POLICY``
    is already neutralised away, leaving ``PARTITION p``)? Such a specification is dropped from the target
    statement, and a statement of nothing else is kind "other"."""
    if lo >= hi:
        return False
    w = sig[lo].upper
    nxt = sig[lo + 1].upper if lo + 1 < hi else ""
    third = sig[lo + 2] if lo + 2 < hi else None
    if (w == "SET" and nxt in ("TIFLASH", "HYPO")) or w in ("CACHE", "NOCACHE", "COMPACT", "ATTRIBUTES"):
        return True
    if w in ("ADD", "DROP") and nxt == "STATS_EXTENDED":
        return True
    if w == "PARTITION" and nxt != "BY":
        return third is None or third.is_word("ATTRIBUTES", "SET")
    # a TiFlash-only index; ``ADD vector VECTOR(3)`` adds a column named vector
    return w == "ADD" and nxt in ("VECTOR", "COLUMNAR") and third is not None and third.is_word("INDEX", "KEY")


def restores_data_statement(sig: Sequence[Token]) -> str | None:
    """RECOVER TABLE / FLASHBACK restore data upstream that TiCDC does not send as row changes."""
    first = sig[0] if sig else None
    if first is not None and first.is_word("RECOVER", "FLASHBACK"):
        return (f"{first.upper} restores dropped or earlier data upstream, and TiCDC does not send that data as "
                "row changes, so the target cannot reproduce it: restore the table on the target from a backup "
                "or re-sync it")
    return None
