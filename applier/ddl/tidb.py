"""TiDB-only syntax removal shared by both target dialects, and the small MySQL/TiDB lexer it stands on.

The lexer (:func:`tokenize`) is lossless: the texts of its tokens concatenate back to the input, so a
translator can rewrite exact character spans (a table name, a TiDB keyword) and leave every other byte of
the statement as the user wrote it. It knows MySQL's lexical rules that matter for DDL:

* ``'...'`` and ``"..."`` strings (backslash escapes and doubled quotes), ``X'..'``/``B'..'`` literals,
  ``0x..``/``0b..`` numbers, backtick-quoted identifiers with doubled backticks, unquoted identifiers that
  contain non-ASCII letters (``表1``) or start with a digit (``1t``);
* comments: ``-- `` (dash dash *space*), ``#``, ``/* */``; TiDB feature comments ``/*T![feature] ... */``
  are one token of kind ``tidb_comment``; MySQL versioned comments ``/*!40101 ... */`` are lexed *through*:
  the opener and closer are tokens of kind ``vopen``/``vclose`` and the content is ordinary tokens, because
  MySQL (and TiDB) execute that content.

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
``/*!40101 ... */`` (MySQL versioned comments)        kept as written (their content is MySQL syntax)
====================================================  ==================================================

Bare keywords are removed only inside CREATE TABLE / ALTER TABLE / CREATE INDEX / CREATE|ALTER DATABASE
statements and only in the position where TiDB accepts them (table options at the top level and followed by
``=`` or a value), so a column named ``ttl`` or ``clustered`` survives. :func:`tidb_only_statement` names the
statements that have no meaning outside TiDB (see ``applier/ddl/mysql.py`` for the table).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "Token",
    "Cursor",
    "LexError",
    "tokenize",
    "split_statements",
    "significant",
    "neutralise_tidb",
    "tidb_only_statement",
    "restores_data_statement",
]


class LexError(ValueError):
    """The query cannot be split into tokens (an unterminated string, identifier or comment)."""


@dataclass(frozen=True, slots=True)
class Token:
    kind: str  # ws comment tidb_comment vopen vclose word qident string hexstr bitstr number hexnum bitnum op
    text: str  # exactly as in the source
    start: int
    end: int
    value: str = ""  # unquoted identifier / unescaped string / upper-cased word

    @property
    def upper(self) -> str:
        return self.value if self.kind == "word" else ""

    def is_word(self, *words: str) -> bool:
        return self.kind == "word" and (not words or self.value in words)

    def is_op(self, *ops: str) -> bool:
        return self.kind == "op" and (not ops or self.text in ops)

    @property
    def is_ident(self) -> bool:
        return self.kind in ("word", "qident")

    @property
    def ident(self) -> str:
        """The identifier this token names (unquoted words keep their case)."""
        if self.kind == "qident":
            return self.value
        if self.kind == "word":
            return self.text
        raise LexError(f"{self.text!r} is not an identifier")


INSIGNIFICANT = frozenset({"ws", "comment", "tidb_comment", "vopen", "vclose"})

_MULTI_OPS = ("<=>", "->>", "<=", ">=", "<>", "!=", "||", "&&", ":=", "->", "<<", ">>", "@@")
_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "%": "\\%", "_": "\\_"}
_NUMBER = re.compile(r"(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")
_HEXNUM = re.compile(r"0x[0-9A-Fa-f]+")
_BITNUM = re.compile(r"0b[01]+")


def _is_ident_char(ch: str) -> bool:
    return ch.isalnum() or ch in "_$" or ord(ch) >= 0x80


def _scan_quoted(sql: str, i: int, quote: str, backslash: bool) -> tuple[int, str]:
    """Scan a quoted string/identifier starting at sql[i] == quote; return (end, unescaped value)."""
    out: list[str] = []
    j = i + 1
    n = len(sql)
    while j < n:
        ch = sql[j]
        if backslash and ch == "\\" and j + 1 < n:
            nxt = sql[j + 1]
            out.append(_ESCAPES.get(nxt, nxt))
            j += 2
            continue
        if ch == quote:
            if j + 1 < n and sql[j + 1] == quote:
                out.append(quote)
                j += 2
                continue
            return j + 1, "".join(out)
        out.append(ch)
        j += 1
    what = "identifier" if quote == "`" else "string"
    raise LexError(f"unterminated quoted {what} starting at character {i}")


def tokenize(sql: str) -> list[Token]:
    """Split ``sql`` into tokens; ``"".join(t.text for t in tokenize(sql)) == sql`` always holds."""
    toks: list[Token] = []
    i = 0
    n = len(sql)
    vclose_pending = False  # inside /*! ... */
    last_sig: Token | None = None

    def add(kind: str, j: int, value: str = "") -> None:
        nonlocal i, last_sig
        tok = Token(kind, sql[i:j], i, j, value)
        toks.append(tok)
        if kind not in INSIGNIFICANT:
            last_sig = tok
        i = j

    while i < n:
        ch = sql[i]
        if ch.isspace():
            j = i + 1
            while j < n and sql[j].isspace():
                j += 1
            add("ws", j)
        elif vclose_pending and sql.startswith("*/", i):
            vclose_pending = False
            add("vclose", i + 2)
        elif sql.startswith("/*", i):
            end = sql.find("*/", i + 2)
            if sql.startswith("/*!", i) and not vclose_pending:
                if end < 0:
                    raise LexError(f"unterminated comment starting at character {i}")
                j = i + 3
                while j < n and sql[j].isdigit():
                    j += 1
                vclose_pending = True
                add("vopen", j)
                continue
            if end < 0:
                raise LexError(f"unterminated comment starting at character {i}")
            kind = "tidb_comment" if sql.startswith("/*T!", i) else "comment"
            add(kind, end + 2)
        elif ch == "#" or (sql.startswith("--", i) and (i + 2 >= n or sql[i + 2].isspace())):
            j = sql.find("\n", i)
            add("comment", n if j < 0 else j)
        elif ch == "`":
            j, val = _scan_quoted(sql, i, "`", backslash=False)
            add("qident", j, val)
        elif ch in "'\"":
            j, val = _scan_quoted(sql, i, ch, backslash=True)
            add("string", j, val)
        elif ch in "xXbB" and i + 1 < n and sql[i + 1] == "'":
            j, val = _scan_quoted(sql, i + 1, "'", backslash=False)
            add("hexstr" if ch in "xX" else "bitstr", j, val)
        elif ch.isdigit() or (ch == "." and i + 1 < n and sql[i + 1].isdigit()
                              and not (last_sig is not None and last_sig.kind in ("word", "qident")
                                       and last_sig.end == i)):
            m = _HEXNUM.match(sql, i) or _BITNUM.match(sql, i)
            if m and not (m.end() < n and _is_ident_char(sql[m.end()])):
                add("hexnum" if m.group().startswith("0x") else "bitnum", m.end(), m.group())
                continue
            m = _NUMBER.match(sql, i)
            j = m.end() if m else i + 1
            if ch != "." and j < n and _is_ident_char(sql[j]) and "." not in sql[i:j]:
                # an identifier that starts with digits, e.g. 1abc
                while j < n and _is_ident_char(sql[j]):
                    j += 1
                add("word", j, sql[i:j].upper())
            else:
                add("number", j, sql[i:j])
        elif _is_ident_char(ch):
            j = i + 1
            while j < n and _is_ident_char(sql[j]):
                j += 1
            add("word", j, sql[i:j].upper())
        else:
            for op in _MULTI_OPS:
                if sql.startswith(op, i):
                    add("op", i + len(op), op)
                    break
            else:
                add("op", i + 1, ch)
    if vclose_pending:
        raise LexError("unterminated /*! ... */ comment")
    return toks


def split_statements(sql: str) -> list[str]:
    """Split a SQL script at top-level ``;`` (not inside strings, identifiers or comments)."""
    out: list[str] = []
    cur: list[str] = []
    for t in tokenize(sql):
        if t.kind == "op" and t.text == ";":
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(t.text)
    out.append("".join(cur).strip())
    return [s for s in out if s and significant(tokenize(s))]


def significant(tokens: Iterable[Token]) -> list[Token]:
    return [t for t in tokens if t.kind not in INSIGNIFICANT]


def strip_terminator(sig: list[Token]) -> list[Token]:
    """Drop trailing ``;`` tokens; a ``;`` anywhere else means several statements (refused by callers)."""
    while sig and sig[-1].is_op(";"):
        sig = sig[:-1]
    return sig


class Cursor:
    """A read position over significant tokens with the small helpers a recursive-descent parser needs."""

    def __init__(self, toks: Sequence[Token], pos: int = 0, end: int | None = None) -> None:
        self.toks = toks
        self.pos = pos
        self.end = len(toks) if end is None else end

    def peek(self, k: int = 0) -> Token | None:
        i = self.pos + k
        return self.toks[i] if 0 <= i < self.end else None

    @property
    def at_end(self) -> bool:
        return self.pos >= self.end

    def next(self) -> Token:
        tok = self.peek()
        if tok is None:
            raise LexError("unexpected end of statement")
        self.pos += 1
        return tok

    def is_kw(self, *words: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok is not None and tok.is_word(*words)

    def is_op(self, *ops: str, k: int = 0) -> bool:
        tok = self.peek(k)
        return tok is not None and tok.is_op(*ops)

    def accept_kw(self, *words: str) -> Token | None:
        if self.is_kw(*words):
            return self.next()
        return None

    def accept_seq(self, *words: str) -> bool:
        """Consume the keyword sequence if it is next, all or nothing."""
        for k, w in enumerate(words):
            if not self.is_kw(w, k=k):
                return False
        self.pos += len(words)
        return True

    def accept_op(self, *ops: str) -> Token | None:
        if self.is_op(*ops):
            return self.next()
        return None

    def expect_kw(self, *words: str) -> Token:
        tok = self.accept_kw(*words)
        if tok is None:
            got = self.peek()
            raise LexError(f"expected {' or '.join(words)}, found {got.text if got else 'end of statement'!r}")
        return tok

    def expect_op(self, op: str) -> Token:
        tok = self.accept_op(op)
        if tok is None:
            got = self.peek()
            raise LexError(f"expected {op!r}, found {got.text if got else 'end of statement'!r}")
        return tok

    def ident(self) -> Token:
        tok = self.peek()
        if tok is None or not tok.is_ident:
            raise LexError(f"expected a name, found {tok.text if tok else 'end of statement'!r}")
        self.pos += 1
        return tok

    def matching(self, open_pos: int | None = None) -> int:
        """Index of the ``)`` matching the ``(`` at ``open_pos`` (default: the current position)."""
        i = self.pos if open_pos is None else open_pos
        if i >= self.end or not self.toks[i].is_op("("):
            found = self.toks[i].text if i < self.end else "end of statement"
            raise LexError(f"expected '(', found {found!r}")
        depth = 0
        while i < self.end:
            t = self.toks[i]
            if t.is_op("("):
                depth += 1
            elif t.is_op(")"):
                depth -= 1
                if depth == 0:
                    return i
            i += 1
        raise LexError("unbalanced parentheses")

    def skip_group(self) -> tuple[int, int]:
        """At ``(``: skip to after the matching ``)``; return the (start, end) token indexes of the inside."""
        close = self.matching()
        inside = (self.pos + 1, close)
        self.pos = close + 1
        return inside


def split_top_level(toks: Sequence[Token], start: int, end: int, sep: str = ",") -> list[tuple[int, int]]:
    """Split toks[start:end] at depth-0 separators; returns (start, end) index pairs (possibly empty)."""
    parts: list[tuple[int, int]] = []
    depth = 0
    lo = start
    for i in range(start, end):
        t = toks[i]
        if t.is_op("("):
            depth += 1
        elif t.is_op(")"):
            depth -= 1
        elif depth == 0 and t.is_op(sep):
            parts.append((lo, i))
            lo = i + 1
    parts.append((lo, end))
    return parts


# ---------------------------------------------------------------------------------------------------------
# TiDB-only syntax removal

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


def _remove_spans(sql: str, toks: Sequence[Token], remove: set[int]) -> str:
    """Rebuild ``sql`` without the tokens whose indexes are in ``remove``, keeping neighbours apart."""
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
        return _remove_spans(query, toks, remove) if remove else query

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
    return _remove_spans(query, toks, remove) if remove else query


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


def restores_data_statement(sig: Sequence[Token]) -> str | None:
    """RECOVER TABLE / FLASHBACK restore data upstream that TiCDC does not send as row changes."""
    first = sig[0] if sig else None
    if first is not None and first.is_word("RECOVER", "FLASHBACK"):
        return (f"{first.upper} restores dropped or earlier data upstream, and TiCDC does not send that data as "
                "row changes, so the target cannot reproduce it: restore the table on the target from a backup "
                "or re-sync it")
    return None


# ---------------------------------------------------------------------------------------------------------
# Identifier and literal helpers shared by the dialect modules


def mysql_quote_ident(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def pg_quote_ident(name: str) -> str:
    if "\0" in name:
        raise LexError("identifier contains a NUL character")
    return '"' + name.replace('"', '""') + '"'


def pg_quote_literal(value: str) -> str:
    """A PostgreSQL string literal (standard_conforming_strings = on, the default since 9.1)."""
    if "\0" in value:
        raise LexError("string contains a NUL character, which PostgreSQL text cannot hold")
    return "'" + value.replace("'", "''") + "'"
