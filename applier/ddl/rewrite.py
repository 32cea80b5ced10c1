"""In-place rewriting of one statement's text, the MySQL/MariaDB translator's only way of changing it.

The translator replaces exact character spans (a routed table name, an ``IF NOT EXISTS`` added, a TiDB-only
specification dropped) and :meth:`Rewrite.render` keeps every other byte as the user wrote it, so column
definitions, types, defaults and comments reach MySQL/MariaDB untouched.
"""

from __future__ import annotations

from applier.ddl.lexer import INSIGNIFICANT, Statement

__all__ = ["Rewrite"]


class Rewrite:
    """The neutralised statement text with its tokens, and the edits to apply to it."""

    def __init__(self, stmt: Statement) -> None:
        self.text = stmt.text
        self.toks = stmt.toks
        self.sig = stmt.sig
        self.edits: list[tuple[int, int, str]] = []

    def replace(self, start: int, end: int, new: str) -> None:
        self.edits.append((start, end, new))

    def insert(self, pos: int, new: str) -> None:
        self.edits.append((pos, pos, new))

    def drop_tokens(self, lo: int, hi: int) -> None:
        """Remove sig[lo:hi] and the whitespace after them."""
        start = self.sig[lo].start
        end = self.sig[hi - 1].end
        while end < len(self.text) and self.text[end] in " \t":
            end += 1
        self.replace(start, end, "")

    def render(self) -> str:
        """The edited statement: leading comments and the trailing ``;`` go (a versioned comment's closer
        stays with its opener); an edit inside a span that another edit already replaced is dropped."""
        keep = [t for t in self.toks if t.kind not in INSIGNIFICANT or t.kind in ("vopen", "vclose")]
        last = self.sig[-1].end
        lo = min(t.start for t in keep)
        hi = max([last] + [t.end for t in keep if t.kind == "vclose"])
        out: list[str] = []
        pos = lo
        for start, end, new in sorted(self.edits, key=lambda e: (e[0], -e[1])):
            if start < pos:
                if end <= pos:
                    continue  # inside a span already replaced (e.g. a removed specification)
                raise AssertionError(f"overlapping DDL edits at {start}")
            out.append(self.text[pos:start])
            out.append(new)
            pos = end
        out.append(self.text[pos:hi])
        return "".join(out).strip()
