"""Every MySQL column type at its limits, as one table and its rows: the Simple protocol's round trip and the row
checksum tests both run it (a module of its own so that neither test module imports the other)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

from applier.events import Column, TableSchema

EDGE_CASES: list[tuple[str, bool, list]] = [
    ("tinyint", False, [-128, 127, 0]),
    ("tinyint", True, [0, 255]),
    ("smallint", False, [-32768, 32767]),
    ("smallint", True, [65535]),
    ("mediumint", False, [-8388608, 8388607]),
    ("mediumint", True, [16777215]),
    ("int", False, [-2147483648, 2147483647]),
    ("int", True, [4294967295]),
    ("bigint", False, [-9223372036854775808, 9223372036854775807]),
    ("bigint", True, [0, 9223372036854775807, 9223372036854775808, 18446744073709551615]),
    ("decimal", False, [Decimal("12345678901234567890123456789012345.123456789012345678901234567890"),
                        Decimal("-0.000000000000000000000000000001"), Decimal("0.00"), Decimal("1.500")]),
    ("decimal", True, [Decimal("99999999999999999999999999999999999999999999999999999999999999999")]),
    ("float", False, [3.14, -1.5e-30, 3.4028234663852886e38, 0.0, 16777216.0]),
    ("double", False, [3.141592653589793, -1.7976931348623157e308, 5e-324, 0.1 + 0.2]),
    ("char", False, ["", "a", "漢字", "é"]),
    ("varchar", False, ["héllo wörld", "😀 emoji", "<tag>&amp;", "\u2028line", "\x00nul", "quote\"\\"]),
    ("text", False, ["long " * 100, "多字节"]),
    ("tinytext", False, ["t"]),
    ("mediumtext", False, ["m"]),
    ("longtext", False, ["l"]),
    ("binary", False, [b"\x00\x00\x00\xff", b""]),
    ("varbinary", False, [b"\x00\xff\x80\x7f", bytes(range(256))]),
    ("tinyblob", False, [b"\xff"]),
    ("blob", False, [b"\x00", b"\x89PNG\r\n\x1a\n"]),
    ("mediumblob", False, [b"\xfe\xff"]),
    ("longblob", False, [b"\x00" * 1000]),
    ("date", False, [dt.date(2024, 2, 29), dt.date(1, 1, 1), dt.date(9999, 12, 31), "0000-00-00"]),
    ("datetime", False, [dt.datetime(2024, 2, 29, 23, 59, 59, 999999), dt.datetime(1000, 1, 1),
                         dt.datetime(2020, 1, 1, 0, 0, 0, 120000), "0000-00-00 00:00:00"]),
    ("timestamp", False, [dt.datetime(2038, 1, 19, 3, 14, 7, 999999), dt.datetime(1970, 1, 1, 0, 0, 1),
                          dt.datetime(2024, 6, 1, 12, 0, 0, 500)]),
    ("time", False, [dt.timedelta(hours=-838, minutes=-59, seconds=-59), dt.timedelta(hours=838, minutes=59,
                     seconds=59), dt.timedelta(hours=25, microseconds=1), -dt.timedelta(microseconds=500000),
                     dt.timedelta(0)]),
    ("year", False, [1901, 2155, 0, 2024]),
    ("bit", False, [0, 1, 2**64 - 1, 0b1010]),
    ("enum", False, [1, 2, 65535]),
    ("set", False, [0, 1, 7, 2**64 - 1]),
    ("json", False, ['{"a": [1, 2.5, null, true]}', '"str"', "[]", '{"k": "漢"}']),
]


def edge_col(name: str, type_name: str, unsigned: bool = False, **kw) -> Column:
    return Column(name, type_name, unsigned=unsigned, binary=type_name in ("binary", "varbinary", "tinyblob",
                                                                           "blob", "mediumblob", "longblob"),
                  **kw)


def edge_table() -> tuple[TableSchema, list[dict]]:
    cols = [Column("pk", "bigint", nullable=False, key=True, unique=True)]
    rows: list[dict] = []
    width = max(len(v) for _, _, v in EDGE_CASES)
    for i, (type_name, unsigned, _) in enumerate(EDGE_CASES):
        cols.append(edge_col(f"c{i}_{type_name}{'_u' if unsigned else ''}", type_name, unsigned))
    for r in range(width + 1):  # the last row is all NULLs
        row: dict = {"pk": r}
        for i, (type_name, unsigned, values) in enumerate(EDGE_CASES):
            row[cols[i + 1].name] = values[r % len(values)] if r < width else None
        rows.append(row)
    return TableSchema("db", "all_types", 4242, tuple(cols)), rows


