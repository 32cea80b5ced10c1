"""The small MySQL/TiDB lexer every DDL module stands on, and the statement form translators receive.

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

:class:`Cursor` is the read position the recursive-descent parsers move over significant tokens, and
:class:`Statement` is one statement lexed once, so that the shared prelude of ``applier.ddl.translate`` and
the dialect translator after it read the same tokens.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Iterable, Sequence

__all__ = [
    "Token",
    "Cursor",
    "LexError",
    "Statement",
    "INSIGNIFICANT",
    "tokenize",
    "split_statements",
    "significant",
    "strip_terminator",
    "split_top_level",
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


@dataclass(frozen=True)
class Statement:
    """One statement lexed once: the prelude and the dialect translator must agree on its tokens, and the
    MySQL translator edits character spans of ``text`` that the tokens locate."""

    text: str
    toks: list[Token]  # every token, lossless
    sig: list[Token]  # the significant ones, trailing ``;`` dropped

    @classmethod
    def lex(cls, text: str) -> Statement:
        toks = tokenize(text)
        return cls(text, toks, strip_terminator(significant(toks)))
