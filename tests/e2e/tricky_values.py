"""Column types and the values of them that trip up text formats (Dumpling's SQL and CSV, Canal-JSON), for the
load of the real Dumpling's exports of a real TiDB (tests/e2e/test_tidb_load.py)."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

ENUM = ("a", "b", "c d", "ü")
SET = ("x", "y", "z")
TYPES: dict[str, str] = {
    "id": "int", "i": "bigint", "u": "bigint unsigned", "dc": "decimal(20,6)", "f": "float", "d": "double",
    "c": "varchar(64)", "tx": "text", "vb": "varbinary(16)", "bl": "blob", "dt": "date", "dtm": "datetime(6)",
    "ts": "timestamp(6)", "tm": "time(6)", "yr": "year", "b": "bit(10)",
    "e": "enum('a','b','c d','ü')", "st": "set('x','y','z')", "j": "json",
}

# Values that trip up text formats: quotes, backslashes, NULL as a string, Dumpling's CSV null marker, line
# breaks, separators, Ctrl-Z, non-ASCII; binary bytes that are escapes in SQL/CSV; scales, fractions, zero dates.
TRICKY: dict[str, list[Any]] = {
    "i": [0, -1, -9223372036854775808, 9223372036854775807],
    "u": [0, 18446744073709551615, 9223372036854775808],
    "dc": [Decimal("0.000000"), Decimal("-0.000001"), Decimal("99999999999999.999999"), Decimal("-12.5")],
    "f": [0.5, -3.25, 3.4e38, 1.5],
    "d": [0.1, -1.7976931348623157e308, 2.2250738585072014e-308, 12345.678],
    "c": ["O'Brien", 'say "hi"', "back\\slash", "NULL", "\\N", "", "a,b;c", "\\", "'", '"', "ü 😀 李", "x\x1ay"],
    "tx": ["line\nbreak", "cr\r\nlf", "tab\tend", "\\n is not a newline", "'quoted', \"double\"", "NULL",
           "\\N", "", "naïve ☃ 🚀", "%s %(x)s --", "trailing backslash \\"],
    "vb": [b"\x00", b"\x00\x27\x22\x5c\x0a\x0d\x1a\xff", b"", b"\\N", b"NULL", b"\xff\xfe"],
    "bl": [bytes(range(256)), b"\x00" * 10, b"", b"plain text", "ü".encode() + b"\xc3"],
    "dt": [dt.date(2024, 2, 29), dt.date(1000, 1, 1), dt.date(9999, 12, 31), "0000-00-00"],
    "dtm": [dt.datetime(2024, 2, 29, 12, 34, 56, 123456), dt.datetime(1999, 12, 31, 23, 59, 59, 999999),
            dt.datetime(2000, 1, 1), "0000-00-00 00:00:00"],
    "ts": [dt.datetime(2038, 1, 19, 3, 14, 7, 999999), dt.datetime(1970, 1, 1, 0, 0, 1),
           dt.datetime(2020, 6, 1, 12, 0, 0, 500)],
    "tm": [dt.timedelta(hours=838, minutes=59, seconds=59), -dt.timedelta(hours=838, minutes=59, seconds=59),
           -dt.timedelta(microseconds=1), dt.timedelta(hours=100, microseconds=500000), dt.timedelta(0)],
    "yr": [1901, 2155, 2024, 0],
    "b": [0, 1, 1023, 512],
    "e": list(ENUM),
    "st": ["", "x", "x,z", "x,y,z"],
    "j": ['{"a": "b\\"c", "n": [1, 2.5, null, true]}', "null", "[]", '"a string"', '{"ü": "\\\\"}'],
    "extra": ["paid", "sent", "O'Neil", "\\N"],
}
