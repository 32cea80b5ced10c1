"""Test fixture: TiCDC's Canal-JSON encoder.

Produces the Kafka (key, value) records TiCDC's canal-json encoder writes, with and without
``enable-tidb-extension`` (DDL event types as tiflow pkg/sink/codec/canal/canal_entry.go maps them, ``sqlType``
codes from tiflow pkg/sink/codec/internal/java.go), for the unit tests, the changefeed generators and the
benchmark. The applier itself only decodes (:mod:`applier.codecs.canal_json`).
"""

from __future__ import annotations

import datetime as _dt
import time
from decimal import Decimal
from typing import Any, Mapping

from applier import mysql_values as T
from applier.codecs.canal_json import WATERMARK_TYPE
from applier.devtools.encoders import values as V
from applier.devtools.encoders.largemsg import MAX_RECORD_OVERHEAD, LargeMessage, compress
from applier.events import DDL, Column, Op, Resolved, RowChange


#: the canal event types of a DDL message
DDL_TYPES = frozenset({"QUERY", "CREATE", "ALTER", "ERASE", "TRUNCATE", "RENAME", "CINDEX", "DINDEX"})

# java.sql.Types codes TiCDC writes in "sqlType" (tiflow pkg/sink/codec/internal/java.go)
JAVA_BIT = -7
JAVA_TINYINT = -6
JAVA_SMALLINT = 5
JAVA_INTEGER = 4
JAVA_BIGINT = -5
JAVA_REAL = 7
JAVA_DOUBLE = 8
JAVA_DECIMAL = 3
JAVA_CHAR = 1
JAVA_VARCHAR = 12
JAVA_DATE = 91
JAVA_TIME = 92
JAVA_TIMESTAMP = 93
JAVA_BINARY = -2
JAVA_NULL = 0
JAVA_BLOB = 2004
JAVA_CLOB = 2005

# TiDB model.ActionType -> canal event type (tiflow pkg/sink/codec/canal/canal_entry.go convertDdlEventType)
_DDL_ACTION_TO_CANAL: dict[int, str] = {}
for _a in (1, 2, 16, 21, 24, 25, 26, 27, 28, 29, 30, 31, 34, 35, 36, 39, 40):
    _DDL_ACTION_TO_CANAL[_a] = "QUERY"
_DDL_ACTION_TO_CANAL[3] = "CREATE"
for _a in (14, 47):
    _DDL_ACTION_TO_CANAL[_a] = "RENAME"
for _a in (7, 9, 32):
    _DDL_ACTION_TO_CANAL[_a] = "CINDEX"
for _a in (8, 10, 33):
    _DDL_ACTION_TO_CANAL[_a] = "DINDEX"
for _a in (5, 6, 12, 13, 15, 17, 18, 19, 20, 22, 23, 41, 61, 64, 71, 72, 37, 38):
    _DDL_ACTION_TO_CANAL[_a] = "ALTER"
_DDL_ACTION_TO_CANAL[4] = "ERASE"
_DDL_ACTION_TO_CANAL[11] = "TRUNCATE"


def canal_ddl_type(ddl_type: int | str | None) -> str:
    """Canal event type for a DDL: a canal type name passes through, a TiDB action code is mapped."""
    if isinstance(ddl_type, str) and ddl_type in DDL_TYPES:
        return ddl_type
    if isinstance(ddl_type, int) and not isinstance(ddl_type, bool):
        return _DDL_ACTION_TO_CANAL.get(ddl_type, "QUERY")
    return "QUERY"


_INT_JAVA = {"tinyint": JAVA_TINYINT, "smallint": JAVA_SMALLINT, "mediumint": JAVA_INTEGER,
             "int": JAVA_INTEGER, "bigint": JAVA_BIGINT}
_JAVA = {
    "float": JAVA_REAL, "double": JAVA_DOUBLE, "decimal": JAVA_DECIMAL, "null": JAVA_NULL,
    "timestamp": JAVA_TIMESTAMP, "datetime": JAVA_TIMESTAMP, "date": JAVA_DATE, "time": JAVA_TIME,
    "year": JAVA_VARCHAR, "enum": JAVA_INTEGER, "set": JAVA_BIT, "bit": JAVA_BIT, "json": JAVA_VARCHAR,
    "vector": JAVA_VARCHAR, "char": JAVA_CHAR, "varchar": JAVA_VARCHAR,
    "tinytext": JAVA_CLOB, "text": JAVA_CLOB, "mediumtext": JAVA_CLOB, "longtext": JAVA_CLOB,
    "binary": JAVA_BLOB, "varbinary": JAVA_BLOB,
    "tinyblob": JAVA_BLOB, "blob": JAVA_BLOB, "mediumblob": JAVA_BLOB, "longblob": JAVA_BLOB,
}
# unsigned promotion (canal's rule, TiCDC getJavaSQLType): value above the signed max -> next wider type
_UNSIGNED_PROMOTION = {"tinyint": (127, JAVA_SMALLINT), "smallint": (32767, JAVA_INTEGER),
                       "int": (2147483647, JAVA_BIGINT), "bigint": (9223372036854775807, JAVA_DECIMAL)}


def _real_type_name(col: Column) -> str:
    base, _ = T.split_mysql_type(col.type_name)
    return T.binary_type_name(base, col.binary)


def mysql_type_string(col: Column) -> str:
    """TiCDC's default (not content-compatible) mysqlType: the type name plus " unsigned"."""
    name = _real_type_name(col)
    if col.unsigned and name in T.NUMERIC_TYPES:
        return name + " unsigned"
    return name


def java_sql_type(col: Column, value: Any) -> int:
    """TiCDC's sqlType for a column and value (value-dependent for unsigned integers)."""
    name = _real_type_name(col)
    code = _INT_JAVA.get(name)
    if code is None:
        return _JAVA.get(name, JAVA_VARCHAR)
    if col.unsigned and isinstance(value, int):
        limit_code = _UNSIGNED_PROMOTION.get(name)
        if limit_code is not None and value > limit_code[0]:
            return limit_code[1]
    return code


def format_value(col: Column, v: Any) -> str | None:
    """Python value -> the canal-json string TiCDC writes for this column (None for SQL NULL)."""
    if v is None:
        return None
    name = _real_type_name(col)
    if isinstance(v, (bytes, bytearray, memoryview)):
        b = bytes(v)
        if name == "bit":
            return str(V.bits_to_int(b))
        if name in T.BINARY_TYPES:
            return b.decode("latin-1")
        return b.decode("utf-8", "replace")
    if name in T.BINARY_TYPES and isinstance(v, str):
        return v.encode("utf-8").decode("latin-1")
    if isinstance(v, bool):
        return "1" if v else "0"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return V.format_float_fixed(v, single=(name == "float"))
    if isinstance(v, Decimal):
        return V.format_decimal(v)
    if isinstance(v, _dt.datetime):
        return V.format_datetime(v)
    if isinstance(v, _dt.date):
        return V.format_datetime(v) if name in ("datetime", "timestamp") else V.format_date(v)
    if isinstance(v, _dt.timedelta):
        return T.format_time(v)
    if isinstance(v, str):
        return v
    raise ValueError(f"column {col.name!r}: cannot encode {type(v).__name__} for canal-json")


_dumps = V.go_json_dumps  # easyjson / encoding/json escape <, >, & like this


# content-compatible=true: TiDB's full column type (GetTypeDesc) with MySQL's default display widths
_DEFAULT_WIDTH = {"tinyint": (4, 3), "smallint": (6, 5), "mediumint": (9, 8), "int": (11, 10), "bigint": (20, 20)}
_DEFAULT_PARAMS = {"decimal": "(10,0)", "bit": "(1)", "year": "(4)", "char": "(1)", "binary": "(1)",
                   "varchar": "(255)", "varbinary": "(255)"}


def mysql_type_full(col: Column, full_type: str | None = None) -> str:
    """The ``mysqlType`` TiCDC writes with ``content-compatible=true``: the full column type as TiDB prints it
    ("int(10) unsigned", "decimal(10,2)", "varchar(255)", "enum('a','b')").

    ``full_type`` (the column's real type) wins, then the column's own ``declared`` type. Otherwise MySQL's default display width is used for integer,
    DECIMAL, BIT, YEAR, CHAR and BINARY; VARCHAR/VARBINARY have no default length and get a placeholder 255,
    ENUM/SET their bare names (the member list is not in the event model).
    """
    full_type = full_type or col.declared
    if full_type:
        return full_type.lower()
    name = _real_type_name(col)
    unsigned = col.unsigned and name in T.NUMERIC_TYPES
    widths = _DEFAULT_WIDTH.get(name)
    if widths is not None:
        out = f"{name}({widths[1] if unsigned else widths[0]})"
    else:
        out = name + _DEFAULT_PARAMS.get(name, "")
    return out + " unsigned" if unsigned else out


def encode_canal_json(
    event: Any,
    *,
    build_ts_ms: int | None = None,
    enable_tidb_extension: bool = True,
    content_compatible: bool = False,
    only_output_updated_columns: bool | None = None,
    delete_only_handle_key: bool = False,
    legacy_delete_old: bool = False,
    mysql_types: Mapping[str, str] | None = None,
    compression: str = "none",
    large_message: LargeMessage | None = None,
) -> tuple[bytes | None, bytes]:
    """One RowChange / DDL / Resolved -> (key, value) as TiCDC's canal-json encoder writes it.

    The key is always None: TiCDC sends canal-json without a Kafka key and picks the partition with its
    dispatcher, so callers choose the partition. ``build_ts_ms`` fixes the "ts" field (TiCDC puts the wall
    clock there; tests pin it). Field order, ``es`` (= commit ts >> 18), ``pkNames`` (null without a key),
    ``sqlType`` (value-dependent unsigned promotion), ``mysqlType`` and ``old`` (all columns for updates)
    follow TiCDC's encoder. A Resolved needs the extension (TiCDC sends no watermark without it).

    Changefeed variants:

    * ``enable_tidb_extension=False``: no ``_tidb`` (no commit ts; no watermarks at all).
    * ``content_compatible=True``: ``mysqlType`` carries the full type (:func:`mysql_type_full`; pass the
      real types in ``mysql_types``, column name -> type) and, as in TiCDC, implies
      ``only_output_updated_columns``.
    * ``only_output_updated_columns=True``: an UPDATE's ``old`` holds only the columns whose value changed.
    * ``delete_only_handle_key=True`` (``delete-only-output-handle-key-columns``): a DELETE's ``data``,
      ``sqlType`` and ``mysqlType`` cover only the key columns.
    * ``legacy_delete_old=True``: the shape TiCDC sent before v5.4, where a DELETE's ``old`` repeats ``data``.
    * ``compression`` (``large-message-handle-compression``: "snappy"/"lz4"): every value (rows, DDL,
      watermarks) is compressed.
    * ``large_message`` (``large-message-handle-option``, needs the extension): a row message it finds too large
      (length = compressed value + sarama's record overhead) is sent with only its handle-key columns in ``data``,
      ``old``, ``sqlType`` and ``mysqlType`` and ``_tidb.onlyHandleKey: true`` (handle-key-only), or
      ``_tidb.claimCheckLocation`` after the full compressed value went to the claim-check storage with a nil key
      (ticdc pkg/sink/codec/canal/canal_json_encoder.go ``AppendRowChangedEvent``, ``newJSONMessageForDML``).
    """
    key, value = _encode_canal_json(event, build_ts_ms=build_ts_ms, enable_tidb_extension=enable_tidb_extension,
                                    content_compatible=content_compatible,
                                    only_output_updated_columns=only_output_updated_columns,
                                    delete_only_handle_key=delete_only_handle_key,
                                    legacy_delete_old=legacy_delete_old, mysql_types=mysql_types)
    value = compress(compression, value)
    if isinstance(event, RowChange) and large_message is not None \
            and large_message.too_large(event, len(value) + MAX_RECORD_OVERHEAD):
        if not enable_tidb_extension:
            raise ValueError("TiCDC refuses large-message-handle-option for canal-json without the TiDB extension")
        ext: dict[str, Any] = {"onlyHandleKey": True}
        if large_message.claim:
            assert large_message.claim_check is not None
            ext = {"claimCheckLocation": large_message.claim_check.write(None, value)}
        _, small = _encode_canal_json(event, build_ts_ms=build_ts_ms, content_compatible=content_compatible,
                                      only_output_updated_columns=only_output_updated_columns,
                                      mysql_types=mysql_types, only_handle_key=True, extension=ext)
        value = compress(compression, small)
    return key, value


def _encode_canal_json(
    event: Any,
    *,
    build_ts_ms: int | None = None,
    enable_tidb_extension: bool = True,
    content_compatible: bool = False,
    only_output_updated_columns: bool | None = None,
    delete_only_handle_key: bool = False,
    legacy_delete_old: bool = False,
    mysql_types: Mapping[str, str] | None = None,
    only_handle_key: bool = False,
    extension: Mapping[str, Any] | None = None,
) -> tuple[bytes | None, bytes]:
    if only_output_updated_columns is None:
        only_output_updated_columns = content_compatible
    types_override = mysql_types or {}
    ts = int(time.time() * 1000) if build_ts_ms is None else build_ts_ms
    if isinstance(event, Resolved):
        if not enable_tidb_extension:
            raise ValueError("canal-json carries watermarks only with enable-tidb-extension=true")
        ext = {"watermarkTs": event.ts} if event.ts else {}
        msg = {"id": 0, "database": "", "table": "", "pkNames": None, "isDdl": False, "type": WATERMARK_TYPE,
               "es": event.ts >> 18, "ts": ts, "sql": "", "sqlType": None, "mysqlType": None,
               "data": None, "old": None, "_tidb": ext}
        return None, _dumps(msg)
    if isinstance(event, DDL):
        msg = {"id": 0, "database": event.schema, "table": event.table, "pkNames": None, "isDdl": True,
               "type": canal_ddl_type(event.ddl_type), "es": event.commit_ts >> 18, "ts": ts,
               "sql": event.query, "sqlType": None, "mysqlType": None, "data": None, "old": None}
        if enable_tidb_extension:
            msg["_tidb"] = {"commitTs": event.commit_ts} if event.commit_ts else {}
        return None, _dumps(msg)
    if not isinstance(event, RowChange):
        raise TypeError(f"cannot encode {type(event).__name__} in canal-json")

    e = event
    if e.op is Op.DELETE:
        row = e.before
        etype = "DELETE"
    elif e.op is Op.INSERT or (e.op is Op.UPDATE and e.before is None):
        row = e.after
        etype = "INSERT"
    else:
        row = e.after
        etype = "UPDATE"
    if row is None:
        raise ValueError(f"{etype} without a row image")
    cols = {c.name: c for c in e.columns}
    pk = [c.name for c in e.columns if c.key]
    if (etype == "DELETE" and delete_only_handle_key) or only_handle_key:
        row = {name: v for name, v in row.items() if name in cols and cols[name].key}
        if not row:
            raise ValueError("delete-only-output-handle-key-columns: the row has no key column")
    sql_type: dict[str, int] = {}
    mysql_type: dict[str, str] = {}
    data: dict[str, Any] = {}
    for name, v in row.items():
        col = cols.get(name)
        if col is None:
            raise ValueError(f"value for column {name!r} has no Column metadata")
        sql_type[name] = java_sql_type(col, v)
        mysql_type[name] = (mysql_type_full(col, types_override.get(name)) if content_compatible
                            else mysql_type_string(col))
        data[name] = format_value(col, v)
    old = None
    if etype == "UPDATE":
        assert e.before is not None
        old_row = {name: format_value(cols[name], v) for name, v in e.before.items() if name in cols}
        if only_output_updated_columns:
            old_row = {name: v for name, v in old_row.items() if name not in data or data[name] != v}
        if only_handle_key:
            old_row = {name: v for name, v in old_row.items() if cols[name].key}
        old = [old_row]
    elif etype == "DELETE" and legacy_delete_old:
        old = [dict(data)]
    msg = {"id": 0, "database": e.schema, "table": e.table, "pkNames": pk or None, "isDdl": False,
           "type": etype, "es": e.commit_ts >> 18, "ts": ts, "sql": "", "sqlType": sql_type,
           "mysqlType": mysql_type, "old": old, "data": [data]}
    if enable_tidb_extension:
        msg["_tidb"] = {"commitTs": e.commit_ts, **(extension or {})}
    return None, _dumps(msg)
