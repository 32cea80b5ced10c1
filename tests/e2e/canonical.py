"""Reading a replica back and comparing it with upstream values: one canonical form per column type, with the
target-side rules of docs/value-rules.md (zero dates, the zero TIMESTAMP, BIT widths, JSON semantics). Shared by
the value tests and the real-TiCDC-stream tests."""

from __future__ import annotations

import datetime as dt
import struct
from decimal import Decimal, localcontext
from typing import Any

import orjson


def read_back(kind: str, engine, schema: str, table: str, types: dict[str, str],
              key: str | tuple[str, ...]) -> dict[Any, dict]:
    """Every row of the target table, as canonical values (see ``canonical_got``), keyed by ``key`` (a column, or
    a tuple of columns for a composite key)."""
    with engine.connect() as c:
        prep = c.dialect.identifier_preparer
        exprs, names = [], []
        for col, full in types.items():
            q = prep.quote(col)
            base = full.split("(")[0]
            if kind == "mariadb":
                if base == "float":
                    q = f"CAST({q} AS DOUBLE)"  # the text protocol prints FLOAT with 6 digits
                elif base == "bit":
                    q = f"{q} + 0"
                exprs.append(q)
                names.append(col)
            elif base in ("date", "datetime", "timestamp"):
                exprs += [f"CASE WHEN isfinite({q}) THEN {q} END", f"NOT isfinite({q})"]
                names += [col, col + "\0inf"]
            elif base == "json":
                exprs.append(f"{q}::text")
                names.append(col)
            else:
                exprs.append(q)
                names.append(col)
        if kind == "mariadb":
            c.exec_driver_sql("SET time_zone = '+00:00'")
        sql = f"SELECT {', '.join(exprs)} FROM {prep.quote(schema)}.{prep.quote(table)}"
        out = {}
        for raw in c.exec_driver_sql(sql).all():
            got = dict(zip(names, raw))
            row = {}
            for col, full in types.items():
                v = got[col]
                if got.get(col + "\0inf"):
                    v = "-infinity"
                row[col] = canonical_got(kind, col, full, v)
            out[row[key] if isinstance(key, str) else tuple(row[k] for k in key)] = row
    return out


def float32(v: float) -> float:
    return struct.unpack("<f", struct.pack("<f", v))[0]


def zero(s: str) -> tuple[str, str]:
    """A MySQL zero date, compared without fractional digits ('0000-00-00 00:00:00.000000' is the same)."""
    return ("zero date", s.split(".")[0])


def canonical_got(kind: str, col: str, full: str, v: Any) -> Any:
    """A value read from the target, in the form the rules compare."""
    if v is None:
        return None
    base = full.split("(")[0].split(" ")[0]
    if base in ("tinyint", "smallint", "mediumint", "int", "bigint", "year"):
        if isinstance(v, Decimal):  # numeric(20,0) on PostgreSQL
            assert v == v.to_integral_value(), v
        return int(v)
    if base == "float":
        return float32(float(v))
    if base == "double":
        return float(v)
    if base == "decimal":
        return Decimal(v)
    if base in ("binary", "varbinary", "tinyblob", "blob", "mediumblob", "longblob"):
        return bytes(v)
    if base in ("date", "datetime", "timestamp"):
        if v == "-infinity":
            return v
        if isinstance(v, str):
            return zero(v)
        if isinstance(v, dt.datetime) and v.tzinfo is not None:
            return v.astimezone(dt.timezone.utc).replace(tzinfo=None)
        return v
    if base == "bit":
        if isinstance(v, str):  # PostgreSQL bit varying(n): the same bits, all n of them
            width = int(full[4:-1])
            return ("bits", len(v) == width, int(v, 2))
        return ("bits", True, int(v))
    if base == "json":
        return orjson.loads(v)
    return v


def canonical_expected(kind: str, col: str, full: str, v: Any) -> Any:
    """An upstream value (after any protocol loss) in the form the rules compare, for target ``kind``."""
    if v is None:
        return None
    base = full.split("(")[0].split(" ")[0]
    if base in ("date", "datetime", "timestamp") and isinstance(v, str):
        # zero dates: MariaDB keeps them; PostgreSQL has none and stores -infinity (docs/value-rules.md)
        return zero(v) if kind == "mariadb" else "-infinity"
    if base == "timestamp" and v == dt.datetime(1970, 1, 1):
        # 1970-01-01 00:00:00 UTC is MySQL's zero TIMESTAMP (the range starts a second later): both writers
        # store it as their zero-date form, so Debezium's epoch-for-zero lands as the zero TIMESTAMP again
        return zero("0000-00-00 00:00:00") if kind == "mariadb" else "-infinity"
    if base == "float":
        return float32(v)
    if base == "bit":
        return ("bits", True, v)
    if base == "json":
        return orjson.loads(v)
    if base == "decimal":
        return Decimal(v)
    return v


def debezium_decimal(v: Decimal) -> Decimal:
    d = Decimal(repr(float(v)))
    with localcontext() as ctx:
        ctx.prec = 100
        return d.quantize(Decimal(1)) if d.as_tuple().exponent > 0 else d
