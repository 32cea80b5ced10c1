"""Test fixture: TiCDC's Debezium protocol encoder (``protocol=debezium``, JSON).

Produces the Kafka (key, value) records TiCDC's debezium encoder writes (pingcap/tiflow and pingcap/ticdc
``pkg/sink/codec/debezium/{codec,encoder}.go``): row changes with or without the schema envelope and
``tidb_type``, DDL schema-change messages and ``op: "m"`` watermarks, for the unit tests, the changefeed
generators and the benchmark. The applier itself only decodes (:mod:`applier.codecs.debezium`).
"""

from __future__ import annotations

import base64
import datetime as _dt
import re
from decimal import Decimal
from typing import Any, Mapping, Sequence

import orjson

from applier import mysql_values as T
from applier.codecs.debezium import _EPOCH_DATE, _EPOCH_DT, _UTC, _zone
from applier.devtools.encoders import values as V
from applier.events import DDL, Column, Op, Resolved, RowChange

__all__ = ["encode_debezium", "encode_value", "field_schema"]

DEBEZIUM_VERSION = "2.4.0.Final"
CONNECTOR = "TiCDC"

_dumps = V.go_json_dumps

# TiDB model.ActionType -> Debezium tableChanges type (tiflow codec.go EncodeDDLEvent); others are not sent
_DDL_CHANGE_TYPE: dict[int, str] = {}
for _a in (1, 3, 21, 60):  # create schema / table / view, create tables
    _DDL_CHANGE_TYPE[_a] = "CREATE"
for _a in (5, 12, 6, 61, 19, 72, 64, 42, 71, 23, 20, 13, 15, 17, 22, 26, 7, 41, 18, 14, 47, 32, 33):
    _DDL_CHANGE_TYPE[_a] = "ALTER"
for _a in (2, 4, 8, 24, 11):  # drop schema / table / index / view, truncate table
    _DDL_CHANGE_TYPE[_a] = "DROP"
_ACTION_CREATE_SCHEMA, _ACTION_DROP_SCHEMA, _ACTION_DROP_TABLE = 1, 2, 4
_ACTION_TRUNCATE_TABLE, _ACTION_RENAME_TABLE = 11, 14

# java.sql.Types per MySQL type (tiflow internal/java.go MySQLType2JdbcType)
_JDBC = {"tinyint": 5, "smallint": 5, "mediumint": 4, "int": 4, "year": 4, "float": 6, "double": 8,
         "null": 0, "decimal": 3, "timestamp": 2014, "datetime": 93, "bigint": -5, "date": 91, "time": 92,
         "enum": 1, "set": 1, "bit": -7, "json": 12, "vector": 12,
         "char": 1, "varchar": 12, "tinytext": 12, "text": 12, "mediumtext": 12, "longtext": 12,
         "binary": 2004, "varbinary": 2004, "tinyblob": 2004, "blob": 2004, "mediumblob": 2004,
         "longblob": 2004}
_CHARSET_TYPES = frozenset({"char", "varchar", "tinytext", "text", "mediumtext", "longtext", "enum", "set"})


class _FieldType:
    """What TiCDC's FieldType says about a column, as far as the encoder needs it."""

    __slots__ = ("base", "unsigned", "flen", "decimal", "elems")

    def __init__(self, base: str, unsigned: bool, flen: int, decimal: int, elems: tuple[str, ...]) -> None:
        self.base, self.unsigned, self.flen, self.decimal, self.elems = base, unsigned, flen, decimal, elems


def _split_args(text: str) -> list[str]:
    """"'a','b''c'" or "10,5" -> items, quotes removed and '' un-doubled."""
    items, cur, i, n = [], [], 0, len(text)
    quoted = False
    while i < n:
        ch = text[i]
        if ch == "'":
            if quoted and i + 1 < n and text[i + 1] == "'":
                cur.append("'")
                i += 2
                continue
            quoted = not quoted
        elif ch == "," and not quoted:
            items.append("".join(cur).strip())
            cur = []
        elif ch == "\\" and quoted and i + 1 < n:
            cur.append(text[i + 1])
            i += 2
            continue
        else:
            cur.append(ch)
        i += 1
    items.append("".join(cur).strip())
    return items


def _field_type(col: Column, full_type: str | None) -> _FieldType:
    base, unsigned = T.split_mysql_type(full_type or col.type_name)
    base = T.binary_type_name(base, col.binary)
    unsigned = unsigned or col.unsigned
    flen, decimal, elems = -1, -1, ()
    if full_type and "(" in full_type:
        inner = full_type[full_type.index("(") + 1: full_type.rindex(")")]
        args = _split_args(inner)
        if base in ("enum", "set"):
            elems = tuple(args)
        elif base in ("datetime", "timestamp", "time"):
            decimal = int(args[0])
        else:
            flen = int(args[0])
            if len(args) > 1:
                decimal = int(args[1])
    if base in ("datetime", "timestamp", "time") and decimal < 0:
        decimal = 0 if full_type else 6  # a bare Column: keep microseconds
    if base == "bit" and flen < 0:
        flen = 1 if full_type else 64  # MySQL's BIT means BIT(1); a bare Column: 64 bits
    if base == "decimal" and flen < 0 and full_type:
        flen, decimal = 10, 0
    return _FieldType(base, unsigned, flen, decimal, elems)


def _go_add_years(d: _dt.date, years: int) -> _dt.date:
    """Go's AddDate(years, 0, 0): Feb 29 of a non-leap target year normalises to Mar 1."""
    try:
        return d.replace(year=d.year + years)
    except ValueError:
        return _dt.date(d.year + years, 3, 1)


def _two_digit_year(d: _dt.date) -> _dt.date:
    if d.year < 70:
        return _go_add_years(d, 2000)
    if d.year < 100:
        return _go_add_years(d, 1900)
    return d


def _bit_int(v: Any) -> int:
    if isinstance(v, (bytes, bytearray)):
        return V.bits_to_int(bytes(v))
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    raise ValueError(f"expected an int for BIT, got {type(v).__name__}")


def encode_value(col: Column, ft: _FieldType | None, v: Any, *, tz: _dt.tzinfo = _UTC) -> Any:
    """Python value -> the JSON value TiCDC's debezium encoder writes for this column."""
    ft = ft or _field_type(col, None)
    if v is None:
        return None
    b = ft.base
    if b == "bit":
        n = ft.flen
        iv = _bit_int(v)
        if n == 1:
            return iv != 0
        nbytes = (n + 7) // 8
        return base64.b64encode((iv & ((1 << 64) - 1)).to_bytes(8, "little")[:nbytes]).decode("ascii")
    if b in T.INTEGER_TYPES:
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"column {col.name!r}: expected int, got {type(v).__name__}")
        if ft.unsigned and b == "bigint" and v >= 1 << 63:
            return v - (1 << 64)  # int64(v); the maximum becomes -1
        return v
    if b == "year":
        return int(v)
    if b == "float":
        return T.shortest_float32(float(v))
    if b == "double":
        return float(v)
    if b == "decimal":
        return float(Decimal(v) if not isinstance(v, float) else v)
    if b in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext"):
        if isinstance(v, (bytes, bytearray)):
            return bytes(v).decode("utf-8", "replace")
        return str(v)
    if b in T.BINARY_TYPES:
        data = v.encode("utf-8") if isinstance(v, str) else bytes(v)
        return base64.b64encode(data).decode("ascii")
    if b in ("enum", "set"):
        if isinstance(v, str):
            return v
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"column {col.name!r}: expected a name or ordinal, got {type(v).__name__}")
        if not ft.elems:
            raise ValueError(f"column {col.name!r}: {b} ordinal without the member list (pass field_types)")
        if b == "enum":
            return ft.elems[v - 1] if 1 <= v <= len(ft.elems) else ""
        if v >> len(ft.elems):
            return ""
        return ",".join(e for i, e in enumerate(ft.elems) if v >> i & 1)
    if b == "date":
        if isinstance(v, str):  # a zero date
            return None if col.nullable else 0
        if isinstance(v, _dt.datetime):
            v = v.date()
        return (_two_digit_year(v) - _EPOCH_DATE).days
    if b == "datetime":
        if isinstance(v, str):
            return None if col.nullable else 0
        if not isinstance(v, _dt.datetime):
            v = _dt.datetime(v.year, v.month, v.day)
        d = _two_digit_year(v.date())
        v = _dt.datetime.combine(d, v.time())
        us = (v - _EPOCH_DT) // _dt.timedelta(microseconds=1)
        return us // 1000 if ft.decimal <= 3 else us
    if b == "timestamp":
        if isinstance(v, str):
            return "1970-01-01T00:00:00Z"
        if not isinstance(v, _dt.datetime):
            v = _dt.datetime(v.year, v.month, v.day)
        u = v.replace(tzinfo=tz).astimezone(_UTC)
        if u < _dt.datetime(1970, 1, 1, 0, 0, 1, tzinfo=_UTC):
            return "1970-01-01T00:00:00Z"
        s = u.strftime("%Y-%m-%dT%H:%M:%S")
        if ft.decimal > 0:
            s += f".{u.microsecond:06d}"[: 1 + ft.decimal]
        return s + "Z"
    if b == "time":
        if not isinstance(v, _dt.timedelta):
            raise ValueError(f"column {col.name!r}: expected timedelta, got {type(v).__name__}")
        return (v.days * 86400 + v.seconds) * 1_000_000 + v.microseconds
    if b == "json":
        return v if isinstance(v, str) else orjson.dumps(v).decode()
    if b == "vector":
        return str(v)
    raise ValueError(f"column {col.name!r}: type {col.type_name!r} cannot be encoded for debezium")


def field_schema(col: Column, ft: _FieldType, *, tidb_extension: bool = False) -> dict:
    """The Connect field schema TiCDC writes for a column (writeDebeziumFieldSchema, without defaults)."""
    out: dict[str, Any] = {}
    if tidb_extension:
        out["tidb_type"] = _tidb_type(ft)
    b, optional = ft.base, col.nullable

    def logical(ctype: str, name: str, params: dict | None = None) -> None:
        out.update(type=ctype, optional=optional, name=name, version=1)
        if params is not None:
            out["parameters"] = params
        out["field"] = col.name

    def plain(ctype: str) -> None:
        out.update(type=ctype, optional=optional, field=col.name)

    if b == "bit":
        if ft.flen == 1:
            plain("boolean")
        else:
            logical("bytes", "io.debezium.data.Bits", {"length": str(ft.flen)})
    elif b in ("char", "varchar", "tinytext", "text", "mediumtext", "longtext") or b in T.BINARY_TYPES:
        plain("string")
    elif b == "enum":
        logical("string", "io.debezium.data.Enum",
                {"allowed": ",".join(e.replace(",", "\\,") for e in ft.elems)})
    elif b == "set":
        logical("string", "io.debezium.data.EnumSet", {"allowed": ",".join(ft.elems)})
    elif b == "date":
        logical("int32", "io.debezium.time.Date")
    elif b == "datetime":
        logical("int64", "io.debezium.time.Timestamp" if ft.decimal <= 3 else "io.debezium.time.MicroTimestamp")
    elif b == "timestamp":
        logical("string", "io.debezium.time.ZonedTimestamp")
    elif b == "time":
        logical("int64", "io.debezium.time.MicroTime")
    elif b == "json":
        logical("string", "io.debezium.data.Json")
    elif b == "tinyint":
        plain("int16")
    elif b == "smallint":
        plain("int32" if ft.unsigned else "int16")
    elif b == "mediumint":
        plain("int32")
    elif b == "int":
        plain("int64" if ft.unsigned else "int32")
    elif b == "bigint":
        plain("int64")
    elif b == "float":
        plain("double" if ft.decimal != -1 else "float")
    elif b in ("double", "decimal"):
        plain("double")
    elif b == "year":
        logical("int32", "io.debezium.time.Year")
    elif b == "vector":
        out.update(type="string", optional=optional, name="io.debezium.data.TiDBVectorFloat32", field=col.name)
    else:
        raise ValueError(f"column {col.name!r}: type {col.type_name!r} has no debezium schema")
    return out


def _tidb_type(ft: _FieldType) -> str:
    if ft.unsigned and ft.base in T.NUMERIC_TYPES and ft.base != "decimal":
        return ft.base + " unsigned"
    return ft.base


def _sanitize(name: str, *, topic: bool = False) -> str:
    out = []
    for i, ch in enumerate(name):
        ok_first = ("a" <= ch <= "z") or ("A" <= ch <= "Z") or ch == "_"
        ok = ok_first or ("0" <= ch <= "9") or (topic and ch == ".")
        if not topic and i == 0 and not ok_first:
            out.append("_")
            if "0" <= ch <= "9":
                out.append(ch)
        elif not ok:
            out.append("_")
        else:
            out.append(ch)
    return "".join(out)


def _source(cluster_id: str, commit_ts: int, db: str, table: str) -> dict:
    return {"version": DEBEZIUM_VERSION, "connector": CONNECTOR, "name": cluster_id, "ts_ms": commit_ts >> 18,
            "snapshot": "false", "db": db, "table": table, "server_id": 0, "gtid": None, "file": "", "pos": 0,
            "row": 0, "thread": 0, "query": None, "commit_ts": commit_ts, "cluster_id": cluster_id}


def _f(ctype: str, optional: bool, field: str, **extra: Any) -> dict:
    return {"type": ctype, "optional": optional, **extra, "field": field}


def _source_schema() -> dict:
    return {"type": "struct", "fields": [
        _f("string", False, "version"), _f("string", False, "connector"), _f("string", False, "name"),
        _f("int64", False, "ts_ms"),
        _f("string", True, "snapshot", name="io.debezium.data.Enum", version=1,
           parameters={"allowed": "true,last,false,incremental"}, default="false"),
        _f("string", False, "db"), _f("string", True, "sequence"), _f("string", True, "table"),
        _f("int64", False, "server_id"), _f("string", True, "gtid"), _f("string", False, "file"),
        _f("int64", False, "pos"), _f("int32", False, "row"), _f("int64", True, "thread"),
        _f("string", True, "query"),
    ], "optional": False, "name": "io.debezium.connector.mysql.Source", "field": "source"}


def _tail_schema() -> list[dict]:
    return [
        _f("string", False, "op"),
        _f("int64", True, "ts_ms"),
        {"type": "struct", "fields": [_f("string", False, "id"), _f("int64", False, "total_order"),
                                      _f("int64", False, "data_collection_order")],
         "optional": True, "name": "event.block", "version": 1, "field": "transaction"},
    ]


def _sfield(field: str, optional: bool, ctype: str, **extra: Any) -> dict:
    return {"field": field, "optional": optional, "type": ctype, **extra}


def _schema_change_value_schema() -> dict:
    column = {"name": "io.debezium.connector.schema.Column", "optional": False, "type": "struct", "version": 1,
              "fields": [
                  _sfield("name", False, "string"), _sfield("jdbcType", False, "int32"),
                  _sfield("nativeType", True, "int32"), _sfield("typeName", False, "string"),
                  _sfield("typeExpression", True, "string"), _sfield("charsetName", True, "string"),
                  _sfield("length", True, "int32"), _sfield("scale", True, "int32"),
                  _sfield("position", False, "int32"), _sfield("optional", True, "boolean"),
                  _sfield("autoIncremented", True, "boolean"), _sfield("generated", True, "boolean"),
                  _sfield("comment", True, "string"), _sfield("defaultValueExpression", True, "string"),
                  _sfield("enumValues", True, "array", items={"type": "string", "optional": False}),
              ]}
    table = _sfield("table", True, "struct", name="io.debezium.connector.schema.Table", version=1, fields=[
        _sfield("defaultCharsetName", True, "string"),
        _sfield("primaryKeyColumnNames", True, "array", items={"type": "string", "optional": False}),
        _sfield("columns", False, "array", items=column),
        _sfield("comment", True, "string"),
    ])
    change = {"name": "io.debezium.connector.schema.Change", "optional": False, "type": "struct", "version": 1,
              "fields": [_sfield("type", False, "string"), _sfield("id", False, "string"), table]}
    return {"optional": False, "type": "struct", "version": 1,
            "name": "io.debezium.connector.mysql.SchemaChangeValue",
            "fields": [_source_schema(), _sfield("ts_ms", False, "int64"), _sfield("databaseName", True, "string"),
                       _sfield("schemaName", True, "string"), _sfield("ddl", True, "string"),
                       _sfield("tableChanges", False, "array", items=change)]}


def _ddl_change_type(ddl: DDL) -> str | None:
    t = ddl.ddl_type
    if isinstance(t, str):
        t = t.upper()
        return t if t in ("CREATE", "ALTER", "DROP") else None
    if isinstance(t, int) and not isinstance(t, bool):
        return _DDL_CHANGE_TYPE.get(t)
    words = ddl.query.split(None, 1)
    first = words[0].upper() if words else ""
    return {"CREATE": "CREATE", "DROP": "DROP", "TRUNCATE": "DROP"}.get(first, "ALTER")


def _table_change_columns(columns: Sequence[Column], field_types: Mapping[str, str], default_charset: str
                          ) -> list[dict]:
    out = []
    for i, col in enumerate(columns):
        ft = _field_type(col, field_types.get(col.name))
        b = ft.base
        type_upper = b.upper()
        suffix = " UNSIGNED" if ft.unsigned and b in T.NUMERIC_TYPES and b != "decimal" else ""
        length: int | None = None
        if b in ("datetime", "timestamp", "time"):
            length = ft.decimal
        elif b == "set":
            length = 2 * len(ft.elems) - 1
        elif b == "enum":
            length = 1
        elif ft.flen >= 0:
            length = ft.flen
        scale = ft.decimal if b in ("decimal", "float", "double") and ft.decimal >= 0 else None
        out.append({
            "name": col.name, "jdbcType": _JDBC.get(b, 12), "nativeType": None, "comment": None,
            "defaultValueExpression": None,
            "enumValues": [f"'{e}'" for e in ft.elems] if ft.elems else None,
            "typeName": type_upper + suffix, "typeExpression": type_upper + suffix,
            "charsetName": default_charset if (b in _CHARSET_TYPES and default_charset) else None,
            "length": length, "scale": scale, "position": i + 1, "optional": col.nullable,
            "autoIncremented": False, "generated": False,
        })
    return out


def encode_debezium(
    event: Any,
    *,
    disable_schema: bool = False,
    cluster_id: str = "test_cluster",
    output_old_value: bool = True,
    enable_tidb_extension: bool = False,
    ts_ms: int | None = None,
    time_zone: str = "UTC",
    field_types: Mapping[str, str] | None = None,
    table_columns: Sequence[Column] | None = None,
    old_table: tuple[str, str] | None = None,
    default_charset: str = "",
) -> tuple[bytes, bytes]:
    """One RowChange / DDL / Resolved -> (key, value) as TiCDC's debezium encoder writes them.

    * ``disable_schema``: ``debezium-disable-schema=true`` (the ``payload`` wrapper stays, ``schema`` goes).
    * ``output_old_value``: False omits ``before`` from updates (TiCDC's DebeziumOutputOldValue).
    * ``enable_tidb_extension``: adds ``tidb_type`` to every column schema; a Resolved (``op: "m"``) can only
      be encoded with it, because TiCDC sends watermarks only then.
    * ``ts_ms``: the payload's wall-clock ``ts_ms`` (TiCDC uses now; tests pin it).
    * ``time_zone``: the zone the event's naive TIMESTAMP values are in (sent as UTC).
    * ``field_types``: column name -> full MySQL type ("bit(5)", "datetime(6)", "enum('a','b')",
      "float(10,3)", "decimal(10,5)"): what TiCDC knows from the table schema and the event model does not.
      Without it DATETIME/TIMESTAMP are treated as fsp 6, BIT as BIT(64), ENUM/SET must be given as names.
    * DDL only: ``table_columns`` (the table's columns after the DDL, for ``tableChanges``), ``old_table``
      ((schema, table) before a RENAME TABLE), ``default_charset`` (``defaultCharsetName``).
    """
    tz = _zone(time_zone)
    now = ts_ms if ts_ms is not None else int(_dt.datetime.now(_UTC).timestamp() * 1000)
    ftypes = dict(field_types or {})
    if isinstance(event, Resolved):
        if not enable_tidb_extension:
            raise ValueError("TiCDC sends debezium watermarks only with enable-tidb-extension=true")
        key: dict[str, Any] = {"payload": {}}
        value: dict[str, Any] = {"payload": {"source": _source(cluster_id, event.ts, "", ""), "ts_ms": now,
                                             "transaction": None, "op": "m"}}
        if not disable_schema:
            key["schema"] = {"type": "struct", "name": f"{_sanitize(cluster_id)}.watermark.Key",
                             "optional": False, "fields": []}
            value["schema"] = {"type": "struct", "optional": False,
                               "name": f"{_sanitize(cluster_id)}.watermark.Envelope", "version": 1,
                               "fields": [_source_schema(), *_tail_schema()]}
        return _dumps(key), _dumps(value)
    if isinstance(event, DDL):
        return _encode_ddl(event, disable_schema, cluster_id, now, ftypes, table_columns, old_table,
                           default_charset)
    if not isinstance(event, RowChange):
        raise TypeError(f"cannot encode {type(event).__name__} in debezium")

    e = event
    cols = {c.name: c for c in e.columns}
    fts = {c.name: _field_type(c, ftypes.get(c.name)) for c in e.columns}

    def image(img: dict) -> dict:
        out = {}
        for name, v in img.items():
            col = cols.get(name)
            if col is None:
                raise ValueError(f"value for column {name!r} has no Column metadata")
            out[name] = encode_value(col, fts[name], v, tz=tz)
        return out

    ns = f"{_sanitize(cluster_id)}.{_sanitize(e.schema)}.{_sanitize(e.table, topic=True)}"
    row_for_key = e.before if e.op is Op.DELETE else e.after
    if row_for_key is None:
        raise ValueError(f"{e.op.value} without its row image")
    key_cols = [c for c in e.columns if c.key]
    key = {"payload": {c.name: encode_value(c, fts[c.name], row_for_key.get(c.name), tz=tz) for c in key_cols}}
    if not disable_schema:
        key["schema"] = {"type": "struct", "name": f"{ns}.Key", "optional": False,
                         "fields": [field_schema(c, fts[c.name], tidb_extension=enable_tidb_extension)
                                    for c in key_cols]}
    payload: dict[str, Any] = {"source": _source(cluster_id, e.commit_ts, e.schema, e.table), "ts_ms": now,
                               "transaction": None}
    if e.op is Op.INSERT:
        assert e.after is not None
        payload.update(op="c", before=None, after=image(e.after))
        present = e.after
    elif e.op is Op.DELETE:
        assert e.before is not None
        payload.update(op="d", after=None, before=image(e.before))
        present = e.before
    else:
        if e.after is None:
            raise ValueError("update without an after image")
        payload["op"] = "u"
        if output_old_value and e.before is not None:
            payload["before"] = image(e.before)
        payload["after"] = image(e.after)
        present = e.after
    value = {"payload": payload}
    if not disable_schema:
        fields = [field_schema(c, fts[c.name], tidb_extension=enable_tidb_extension)
                  for c in e.columns if c.name in present]
        value["schema"] = {"type": "struct", "optional": False, "name": f"{ns}.Envelope", "version": 1,
                           "fields": [
                               {"type": "struct", "optional": True, "name": f"{ns}.Value", "field": "before",
                                "fields": fields},
                               {"type": "struct", "optional": True, "name": f"{ns}.Value", "field": "after",
                                "fields": fields},
                               _source_schema(), *_tail_schema()]}
    return _dumps(key), _dumps(value)


def _encode_ddl(e: DDL, disable_schema: bool, cluster_id: str, now: int, ftypes: dict,
                table_columns: Sequence[Column] | None, old_table: tuple[str, str] | None,
                default_charset: str) -> tuple[bytes, bytes]:
    change_type = _ddl_change_type(e)
    if change_type is None:
        raise ValueError(f"TiCDC does not send DDL type {e.ddl_type!r} in the debezium protocol")
    key: dict[str, Any] = {"payload": {"databaseName": e.schema}}
    if not disable_schema:
        key["schema"] = {"type": "struct", "name": "io.debezium.connector.mysql.SchemaChangeKey",
                         "optional": False, "version": 1,
                         "fields": [{"field": "databaseName", "optional": False, "type": "string"}]}
    changes: list[dict] = []
    is_truncate = e.ddl_type == _ACTION_TRUNCATE_TABLE or e.query.lstrip().upper().startswith("TRUNCATE")
    if e.table and not is_truncate:
        if old_table is not None:
            ident = f'"{old_table[0]}"."{old_table[1]}","{e.schema}"."{e.table}"'
        else:
            ident = f'"{e.schema}"."{e.table}"'
        change: dict[str, Any] = {"type": change_type, "id": ident}
        drop_table = e.ddl_type == _ACTION_DROP_TABLE or (
            not isinstance(e.ddl_type, int) and re.match(r"\s*DROP\s+TABLE\b", e.query, re.I) is not None)
        if drop_table:
            change["table"] = None
        else:
            cols = list(table_columns or ())
            change["table"] = {
                "defaultCharsetName": default_charset,
                "primaryKeyColumnNames": [c.name for c in cols if c.key],
                "columns": _table_change_columns(cols, ftypes, default_charset),
                "comment": None,
            }
        changes.append(change)
    payload = {"source": _source(cluster_id, e.commit_ts, e.schema, e.table), "ts_ms": now,
               "databaseName": e.schema, "schemaName": None, "ddl": e.query, "tableChanges": changes}
    value: dict[str, Any] = {"payload": payload}
    if not disable_schema:
        value["schema"] = _schema_change_value_schema()
    return _dumps(key), _dumps(value)
