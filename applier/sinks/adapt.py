"""Applying per-column value converters to a batch: the dialect-independent part of value adaptation.

Each writer says, per target column type, which converter (if any) turns a decoded upstream value into what
that column stores (``Sink.value_converter``); this module caches those per table shape and runs them over
rows and keys with as little per-row work as possible. A converter marked ``check_only`` only validates, on
the first non-NULL value of its column in a batch. A converter may declare ``acts_on``, the value types it can
change (every other value comes back as it is): a column whose batch holds none of those is skipped after one
C-level scan of its value types, which is the usual case (PostgreSQL's zero-date rule only acts on strings, and
a DATE column normally holds dates).
"""

from __future__ import annotations

import operator
from typing import Any, Callable

from applier.sinks.table import ApplyError, TableMeta


class ValueRefused(ValueError):
    """A value the target column cannot take; adapt_rows/adapt_keys add the table and column."""



Converters = tuple[tuple[str, Callable[[Any], Any]], ...]
RowAdapters = tuple[Converters, Converters]  # (conversions, once-per-batch checks)


class AdapterCache:
    """Converters per table shape: (conversions, checks) of (column, converter) pairs for a column set,
    (position, converter) pairs for the key (keys are few: checks run on every key). Entries hold their
    TableMeta, so an id is never reused while its entry lives; a re-reflected table (after a DDL) is a new
    TableMeta and gets new entries."""

    LIMIT = 4096

    def __init__(self, factory: Callable[[str | None], Callable[[Any], Any] | None]) -> None:
        self.factory = factory
        self._rows: dict[tuple[int, tuple[str, ...]], tuple[TableMeta, RowAdapters]] = {}
        self._keys: dict[int, tuple[TableMeta, tuple[tuple[int, Callable[[Any], Any]], ...]]] = {}

    def row(self, meta: TableMeta, cols: tuple[str, ...]) -> RowAdapters:
        k = (id(meta), cols)
        hit = self._rows.get(k)
        if hit is not None and hit[0] is meta:
            return hit[1]
        pairs = [(c, f) for c in cols if (f := self.factory(meta.types.get(c))) is not None]
        adapters = (tuple(p for p in pairs if not getattr(p[1], "check_only", False)),
                    tuple(p for p in pairs if getattr(p[1], "check_only", False)))
        if len(self._rows) >= self.LIMIT:
            self._rows.clear()
        self._rows[k] = (meta, adapters)
        return adapters

    def key(self, meta: TableMeta) -> tuple[tuple[int, Callable[[Any], Any]], ...]:
        hit = self._keys.get(id(meta))
        if hit is not None and hit[0] is meta:
            return hit[1]
        convs = tuple((i, f) for i, c in enumerate(meta.key) if (f := self.factory(meta.types.get(c))) is not None)
        if len(self._keys) >= self.LIMIT:
            self._keys.clear()
        self._keys[id(meta)] = (meta, convs)
        return convs


def acts_on(conv: Callable[[Any], Any], *types: type) -> None:
    """Declare that ``conv`` returns every value whose type is not (a subclass of) one of ``types`` unchanged
    (and never raises for it); adapt_rows then skips a column whose batch holds no such value."""
    conv.acts_on = types  # type: ignore[attr-defined]


def adapt_rows(meta: TableMeta, adapters: RowAdapters, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Apply the conversions to every row and the checks to the first non-NULL value of their column; a refused
    value becomes an ApplyError naming the table and column. Rows are converted in place: they are the batch
    plan's own dicts (plan_batch copies them), and converters are idempotent.

    Conversions run column by column, each column skipped when its converter's ``acts_on`` types are absent
    from it. If a value is refused, the rows are run again row by row (converters are idempotent), so the
    error names the same first bad value, in row order, as a row-by-row pass would."""
    convs, checks = adapters
    col = ""
    try:
        for col, f in checks:
            for r in rows:
                v = r[col]
                if v is not None:
                    f(v)
                    break
        if not convs:
            return rows
        try:
            for col, f in convs:
                types = getattr(f, "acts_on", None)
                if types is not None:
                    kinds = set(map(type, map(operator.itemgetter(col), rows)))
                    if not any(issubclass(k, types) for k in kinds):
                        continue
                for r in rows:
                    v = r[col]
                    if v is not None:
                        r[col] = f(v)
        except ValueRefused:
            for r in rows:
                for col, f in convs:
                    v = r[col]
                    if v is not None:
                        r[col] = f(v)
    except ValueRefused as exc:
        raise ApplyError(f"column {col!r} of target table {meta.display}: {exc}") from None
    return rows


def adapt_keys(meta: TableMeta, convs: tuple[tuple[int, Callable[[Any], Any]], ...],
               keys: list[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    out = []
    i = 0
    try:
        for k in keys:
            k2 = list(k)
            for i, f in convs:
                v = k2[i]
                if v is not None:
                    k2[i] = f(v)
            out.append(tuple(k2))
    except ValueRefused as exc:
        raise ApplyError(f"key column {meta.key[i]!r} of target table {meta.display}: {exc}") from None
    return out
