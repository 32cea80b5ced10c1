"""TiCDC Canal-JSON (with or without ``enable-tidb-extension``) decoder (the test encoder is
:mod:`applier.devtools.encoders.canal_json`).

One Kafka value is one JSON message (TiCDC sends no key: ``None``)::

    {"id": 0, "database": "test", "table": "t", "pkNames": ["id"], "isDdl": false, "type": "UPDATE",
     "es": <commitTs >> 18, ms>, "ts": <build time, ms>, "sql": "",
     "sqlType": {"id": 4, ...}, "mysqlType": {"id": "int", ...},
     "old": [{"id": "1", ...}], "data": [{"id": "1", ...}],
     "_tidb": {"commitTs": 417318403368288260}}

* ``type``: INSERT / UPDATE / DELETE for rows; for DDL (``isDdl: true``) one of QUERY, CREATE, ALTER, ERASE,
  TRUNCATE, RENAME, CINDEX, DINDEX; ``TIDB_WATERMARK`` (with ``_tidb.watermarkTs``) for resolved ts.
* ``data`` is a list of rows (column -> string or null); each row becomes one RowChange, in order. For
  UPDATE, ``old`` is parallel to ``data`` and holds the old values of all columns (TiCDC default) or only of
  the changed ones (only-output-updated-columns / content-compatible); ``before`` = data[i] overlaid with
  old[i]. An only-updated ``old`` may be ``[{}]`` (nothing changed). For DELETE, ``data`` holds the old row (all
  columns, or only the handle key with ``delete-only-output-handle-key-columns``); ``old`` is ignored: TiCDC
  before v5.4 repeated ``data`` there, later versions send null.
* Values are strings in MySQL text form, converted by ``mysqlType``. With ``content-compatible=true`` TiCDC
  writes the full type (``int(10) unsigned``, ``decimal(10,2)``, ``varchar(255)``, ``enum('a','b')``, the
  shape official Canal uses); the parameters are stripped, so both shapes decode the same. Binary types
  (``mysqlType`` containing ``blob`` or ``binary``, TiCDC's own test) carry their bytes mapped one byte per
  character (ISO-8859-1, tiflow ``canal_entry.go`` ``formatValue`` with ``charmap.ISO8859_1``) and are
  decoded back to the exact bytes; a character above U+00FF in such a value is a DecodeError. ENUM and SET
  values are TiCDC's ordinal / bitmask integers and BIT is its unsigned integer value; all three become
  ``int``.
* ``Column.key`` = the column is in ``pkNames`` (also ``unique``); nullability is not in the message and is
  reported as True. ``Column.type_code`` is the ``sqlType`` (java.sql.Types) code.

Without ``_tidb`` the commit ts is unknown and the stream cannot be gated: with
``require_tidb_extension=True`` (default) such messages are a DecodeError telling the operator to set
``enable-tidb-extension=true``. ``require_tidb_extension=False`` decodes them with ``commit_ts=0`` and makes
the decoder ``gated=False`` (per-key / offset-order application: canal-json without the extension has no
watermark).

Large messages (:mod:`applier.codecs.largemsg`, layouts in docs/large-messages.md): with
``large_message_handle_compression`` ("snappy"/"lz4") every Kafka value (rows, DDL, watermarks) is decompressed
first. A claim-check row (``_tidb.claimCheckLocation``; ``data`` holds only the handle-key columns) is replaced by
the message in the claim-check file (``claim_check_uri``; Go's JSON ``{"key": null, "value": <base64>}``, or the
bare value with ``claim_check_raw_value``), itself compressed like any value, which must be a row message of the
same table, type and commit ts. A handle-key-only INSERT/UPDATE (``_tidb.onlyHandleKey: true``) is completed
from the upstream TiDB (``upstream_url``) as of the commit ts (the old row of an UPDATE, found by ``old``'s key,
as of commit ts - 1), and is a DecodeError naming that option when it is not set; a handle-key-only DELETE is
complete and decodes as it is. TiCDC sends both only with ``enable-tidb-extension=true``.

Any malformed input raises :class:`applier.events.DecodeError` (protocol "canal-json"); nothing else
escapes :meth:`CanalJSONDecoder.decode`.
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Annotated, Any, Callable, Iterable, NamedTuple, Optional

import msgspec
import orjson
import pyarrow as pa

from applier import mysql_values as T
from applier.codecs.base import Malformed, guarded_decode
from applier.codecs.canal_maps import MapMatch
from applier.codecs.largemsg import LargeMessages, UpstreamRow
from applier.columnar import values as V
from applier.columnar.rows import META_TYPES, OP_CODE, ArrowSlice, RowBatch, Shape, build_batch
from applier.events import DDL, Column, KafkaMessage, Op, Resolved, RowChange

PROTOCOL = "canal-json"
WATERMARK_TYPE = "TIDB_WATERMARK"
ROW_TYPES = {"INSERT": Op.INSERT, "UPDATE": Op.UPDATE, "DELETE": Op.DELETE}
# the lane's op codes by message type: looking an Op up in OP_CODE per row hashed the Enum in Python (enum.__hash__)
_TYPE_CODES = {name: OP_CODE[op] for name, op in ROW_TYPES.items()}

_COLUMN_CACHE_LIMIT = 1 << 16
_SHAPE_CACHE_LIMIT = 4096
_SHAPES_PER_TABLE = 8  # kept per table: sqlType varies with the values (unsigned promotion), DDL adds more


_Bad = Malformed  # a reason for a DecodeError; the position is added by guarded_decode


def _to_bytes(v: Any) -> bytes:
    if type(v) is not str:
        raise TypeError(f"expected text, got {type(v).__name__}")
    try:
        return v.encode("latin-1")
    except UnicodeEncodeError:
        raise ValueError(
            "binary value holds characters above U+00FF; canal-json maps each byte to one ISO-8859-1 character"
        ) from None


def _to_int(v: Any) -> int:
    if type(v) is str:
        return int(v)
    if type(v) is int:
        return v
    raise TypeError(f"expected integer text, got {type(v).__name__}")


# what _to_bytes / _to_int run for text, declared so generated row converters inline it (types.row_converter)
T.set_fast_form(_to_bytes, str, operator.methodcaller("encode", "latin-1"))
T.set_fast_form(_to_int, str, int)


class _Shape(NamedTuple):
    """What one message shape decodes with: its Column tuple (shared by every event of that shape), the
    column names of its first row in order, each column's converter, and the generated converter for rows
    with exactly those names in that order (None when the shape is not kept); then what identifies the shape
    (the maps of the message that built it, only read)."""

    columns: tuple[Column, ...]
    names: tuple[str, ...]
    convs: dict[str, Callable[[Any], Any]]
    convert: Callable[[Iterable[Any]], dict[str, Any]] | None
    mysql_types: dict
    sql_types: dict
    code_types: tuple[type, ...]
    pk_names: list | None


class _RowMessage(NamedTuple):
    """A row message as :meth:`CanalJSONDecoder._parse` leaves it: checked up to its rows."""

    obj: dict
    op: Op
    etype: str
    schema: str
    table: str
    commit_ts: int
    pos: Any
    claim_check: Any  # the claim-check location, or None
    handle_only: bool  # an INSERT/UPDATE with only its handle key (completed from the upstream)
    size: int  # what _rows divides among the rows


# decode_arrow reads a plain row message with msgspec against these types: what they let through, _parse and
# _rows_head accept too, with the same values (both parsers keep the last of duplicate keys and refuse invalid
# UTF-8, lone surrogates and trailing data; msgspec's int refuses floats and booleans, as the type() checks do).
# msgspec reads any integer as one, orjson only those in [-2**63, 2**64) (others as floats, which the record path
# refuses): a sqlType code outside int64 is left to the record path, and a commit ts beyond 2**64 fails the
# caller's clock limit. Anything these types do not describe goes
# through _parse, which reads it or says why not.
_OrjsonInt = Annotated[int, msgspec.Meta(ge=-(1 << 63), le=(1 << 63) - 1)]
_LaneImage = list[dict[str, Optional[str]]]


class _LaneTiDB(msgspec.Struct):
    commitTs: int
    claimCheckLocation: Any = None
    onlyHandleKey: Any = None


_NULL = msgspec.Raw(b"null")


class _LaneRow(msgspec.Struct, rename={"tidb": "_tidb"}):
    type: str
    tidb: _LaneTiDB
    data: _LaneImage
    mysqlType: msgspec.Raw  # both maps as raw JSON: matched against known shapes by canal_maps.MapMatch
    database: Optional[str] = None
    table: Optional[str] = None
    isDdl: bool = False
    sqlType: msgspec.Raw = _NULL  # (msgspec reads a Raw only on its own, not in an Optional)
    pkNames: Optional[list[str]] = None
    old: Optional[_LaneImage] = None


_LANE_ENVELOPE = msgspec.json.Decoder(_LaneRow)
# what the lane's maps must parse to when no known shape matches their text (what _LaneRow read them as before)
_LANE_MYSQL_TYPES = msgspec.json.Decoder(dict[str, str])
_LANE_SQL_TYPES = msgspec.json.Decoder(dict[str, Optional[_OrjsonInt]])
_NO_SQL_TYPES = msgspec.Raw(b"{}")


class _LaneHit:
    """A shape :meth:`CanalJSONDecoder._lane_shape` found, with its Arrow kinds and its two maps' matchers."""

    __slots__ = ("found", "mysql_types", "sql_types")

    def __init__(self, shape: _Shape, kinds: tuple[str, ...] | None, mysql_text: msgspec.Raw,
                 sql_text: msgspec.Raw) -> None:
        self.found = (shape, kinds)
        self.mysql_types = MapMatch(shape.mysql_types, mysql_text)
        self.sql_types = MapMatch(shape.sql_types, sql_text)


class _ColumnGroup:
    """The rows of one table, topic, column names and kinds in a slice, gathered by
    :meth:`CanalJSONDecoder.decode_arrow`: per row its position, op, Column tuple and both images' text (the
    missing image as a row of nulls)."""

    __slots__ = ("schema", "table", "topic", "names", "kinds", "convs", "index", "null_row", "variants", "meta",
                 "rows", "befores", "afters")

    def __init__(self, schema: str, table: str, topic: str, names: tuple[str, ...], kinds: tuple[str, ...],
                 convs: list, index: int) -> None:
        self.schema, self.table, self.topic, self.names, self.kinds = schema, table, topic, names, kinds
        self.convs, self.index = convs, index  # the first shape's converters (one kind: one conversion)
        self.null_row = dict.fromkeys(names)
        self.variants: list[tuple[Column, ...]] = []
        self.meta: list[tuple[int, ...]] = []  # per message: rows.META's values and its row count
        self.rows = 0
        self.befores: list[dict] = []
        self.afters: list[dict] = []

    def variant(self, columns: tuple[Column, ...]) -> int:
        for i, v in enumerate(self.variants):
            if v is columns:
                return i
        self.variants.append(columns)
        return len(self.variants) - 1

    def shape(self) -> Shape:
        return Shape(self.schema, self.table, self.topic, self.names, self.kinds, tuple(self.variants))


# _rows builds RowChange positionally (twice as fast as by keyword); make a reordering of its fields loud.
if tuple(f.name for f in dataclasses.fields(RowChange))[:9] != (
        "schema", "table", "commit_ts", "op", "before", "after", "columns", "position", "size"):
    raise ImportError("applier.events.RowChange fields changed order: update canal_json._rows")


def _all_str(items: list) -> bool:
    """Every item is a str. (str.join raises TypeError for anything else; for decoded JSON, where a str is
    never a subclass, it answers like checking type() per item, at a fifth of the cost.)"""
    try:
        "".join(items)
    except TypeError:
        return False
    return True


def _names(obj: dict) -> tuple[str, str]:
    """A message's ``database`` and ``table`` ("" when absent or null); anything but a string is malformed."""
    schema = obj.get("database", "")
    table = obj.get("table", "")
    if schema is None:
        schema = ""
    if table is None:
        table = ""
    if type(schema) is not str or type(table) is not str:
        raise _Bad("'database' and 'table' must be strings")
    return schema, table


def _converter_for(base: str) -> Callable[[Any], Any]:
    """Converter for one column; canal-json specifics on top of the shared text conversions."""
    if base in T.BINARY_TYPES:
        return _to_bytes
    if base in ("enum", "set", "bit"):  # ordinal / bitmask / bit value as decimal text
        return _to_int
    if base in T.INTEGER_TYPES or base == "year":
        return _to_int
    return T.text_converter(base)


def _canal_text(raw: str | bytes | None) -> str | None:
    """MySQL's text of an upstream value as canal-json carries it (binary bytes one per ISO-8859-1 character)."""
    if raw is None or type(raw) is str:
        return raw
    return raw.decode("latin-1")


def _canal_message(sent: dict, new: UpstreamRow, old: UpstreamRow | None) -> dict:
    """The full canal-json message TiCDC would have sent for a row read from the upstream: mysqlType as TiCDC's
    default form (type name, " unsigned"), sqlType from the message for its key columns."""
    mysql_type = {c.name: c.data_type + (" unsigned" if c.unsigned and c.data_type not in ("bit", "year") else "")
                  for c in new.columns}
    sent_sql = sent.get("sqlType") if type(sent.get("sqlType")) is dict else {}
    full = dict(sent)
    full["mysqlType"] = mysql_type
    full["sqlType"] = {n: v for n, v in sent_sql.items() if n in mysql_type}
    full["data"] = [{c.name: _canal_text(new.values.get(c.name)) for c in new.columns}]
    full["old"] = None if old is None else [{c.name: _canal_text(old.values.get(c.name)) for c in old.columns}]
    return full


class CanalJSONDecoder:
    """Decoder for TiCDC's canal-json. Gated when the TiDB extension (commit ts, watermarks) is required."""

    name = PROTOCOL
    decodes_alone = True  # a message's events depend on that message only: may decode in Spark workers

    def __init__(self, *, require_tidb_extension: bool = True, large_message_handle_compression: str = "none",
                 claim_check_uri: str = "", claim_check_location_prefix: str = "",
                 claim_check_raw_value: bool = False, upstream_url: str = "", upstream_time_zone: str = "+00:00",
                 upstream_read_current_state: bool = False) -> None:
        self.require_tidb_extension = bool(require_tidb_extension)
        self._large = LargeMessages(
            PROTOCOL, compression=large_message_handle_compression, claim_check_uri=claim_check_uri,
            claim_check_location_prefix=claim_check_location_prefix, claim_check_raw_value=claim_check_raw_value,
            upstream_url=upstream_url, upstream_time_zone=upstream_time_zone,
            upstream_read_current_state=upstream_read_current_state)
        self._compressed = self._large.compressed
        self.gated = self.require_tidb_extension
        # (name, mysqlType, sqlType, is pk) -> (Column, converter)
        self._columns: dict[tuple[str, str, Any, bool], tuple[Column, Callable[[Any], Any]]] = {}
        # (schema, table) -> its recent message shapes, newest first (see _shape);
        # (names, converters) -> generated row converter
        self._recent: dict[tuple[str, str], list[_Shape]] = {}
        self._row_converters: dict[tuple, Callable[[Iterable[Any]], dict[str, Any]]] = {}
        # decode_arrow: (schema, table) -> its recent shapes with their Arrow kinds, newest first (see _lane_shape)
        self._lane_recent: dict[tuple[str, str], list[_LaneHit]] = {}

    def table_of(self, msg: KafkaMessage) -> tuple[str, str] | None:
        """The table of an undecodable message: its ``database`` and ``table`` fields, when the JSON parses."""
        value = msg.value
        if value and self._large.compressed:
            value = self._large.decompress(value, "value")
        doc = orjson.loads(value) if value else None
        if type(doc) is not dict or doc.get("isDdl") is True:
            return None
        schema, table = doc.get("database"), doc.get("table")
        return (schema, table) if isinstance(schema, str) and isinstance(table, str) else None

    def decode(self, msg: KafkaMessage) -> list:
        """The events of one Kafka record (several for a multi-row message). Raises only DecodeError."""
        return guarded_decode(PROTOCOL, self._decode, msg)

    # -- internals ------------------------------------------------------------------------------------------

    def _decode(self, msg: KafkaMessage) -> list:
        got = self._parse(msg)
        if type(got) is list:
            return got
        obj, op, etype, schema, table, commit_ts, pos, loc, handle_only, size = got
        if loc is not None:
            return self._claim_checked(obj, loc, op, etype, schema, table, commit_ts, pos, size)
        if handle_only:
            return self._from_upstream(obj, op, schema, table, commit_ts, pos, size)
        return self._rows(obj, op, schema, table, commit_ts, pos, size)

    def _parse(self, msg: KafkaMessage) -> "list | _RowMessage":
        """One record up to its rows: the events of a watermark or DDL message, or a row message's fields (its
        rows not yet converted), so that :meth:`_decode` and :meth:`decode_arrow` read a message alike."""
        value = msg.value
        if value is None or len(value) == 0:
            raise _Bad("empty value (a tombstone?); every canal-json message is a JSON object")
        raw_size = len(value)
        if self._compressed:
            value = self._large.decompress(value, "value")
        try:
            obj = orjson.loads(value)
        except orjson.JSONDecodeError as e:
            hint = ("" if self._large.compressed else " (compressed? set large_message_handle_compression to the "
                    "changefeed's large-message-handle-compression)")
            raise _Bad(f"value is not valid JSON{hint}: {e}") from None
        if type(obj) is not dict:
            raise _Bad(f"value is a JSON {type(obj).__name__}, expected an object")

        tidb = obj.get("_tidb")
        if tidb is None:
            if self.require_tidb_extension:
                raise _Bad(
                    "message has no '_tidb' extension, so its commit ts is unknown; the changefeed must set "
                    "enable-tidb-extension=true for gated (transactional) mode"
                )
            tidb = {}
        elif type(tidb) is not dict:
            raise _Bad(f"'_tidb' is a JSON {type(tidb).__name__}, expected an object")

        etype = obj.get("type")
        if type(etype) is not str:
            raise _Bad(f"'type' must be a string (got {etype!r:.40})")
        is_ddl = obj.get("isDdl", False)
        if type(is_ddl) is not bool:
            raise _Bad("'isDdl' must be a boolean")
        pos = msg.position

        if etype == WATERMARK_TYPE and not is_ddl:
            if obj.get("_tidb") is None:
                raise _Bad("TIDB_WATERMARK without '_tidb' carries no watermark")
            ts = tidb.get("watermarkTs", 0)  # Go omits a zero watermark (omitempty)
            if type(ts) is not int or ts < 0:
                raise _Bad(f"'_tidb.watermarkTs' must be a non-negative integer (got {ts!r:.40})")
            return [Resolved(ts=ts, position=pos)]

        commit_ts = self._commit_ts(tidb)
        schema, table = _names(obj)

        if is_ddl:
            query = obj.get("sql")
            if type(query) is not str:
                raise _Bad("DDL message has no 'sql' string")
            return [DDL(schema=schema, table=table, commit_ts=commit_ts, query=query, position=pos,
                        ddl_type=etype, size=len(value))]

        op = ROW_TYPES.get(etype)
        if op is None:
            raise _Bad(f"unknown message type {etype!r:.40} (isDdl=false)")
        loc = tidb.get("claimCheckLocation")
        if loc is not None and loc != "":
            return _RowMessage(obj, op, etype, schema, table, commit_ts, pos, loc, False, raw_size)
        if tidb.get("onlyHandleKey") is True and op is not Op.DELETE:
            return _RowMessage(obj, op, etype, schema, table, commit_ts, pos, None, True, raw_size)
        return _RowMessage(obj, op, etype, schema, table, commit_ts, pos, None, False, len(value))

    # -- whole slices as columns (Spark's Python workers) -----------------------------------------------------

    def decode_arrow(self, msgs: list[KafkaMessage], limit: int) -> ArrowSlice | None:
        """A slice of records decoded straight into Arrow record batches per shape
        (:class:`applier.columnar.rows.ArrowSlice`), or None when any record is not a plain row or watermark message
        or any value is not one :mod:`applier.columnar.values` converts: then the caller decodes the slice record
        by record with :meth:`decode`, which also names whatever is wrong. Watermarks and DDL messages are kept
        as events in their place (``extras``).

        It gives what :meth:`decode` of each record gives (:meth:`ArrowSlice.to_events`), ``size`` as
        :func:`applier.decode.decode_messages` sets it, and every ts checked against ``limit``
        (:func:`applier.clock.clock_limit`). Each row's column names must be its message's first row's, in the same
        order, and an UPDATE's ``old`` must name every column too (a TiCDC default; only-updated-columns ``old``
        images, DDL, claim-check and handle-key-only rows and compressed streams go record by record).
        tests/unit/test_canal_arrow.py holds the two paths equal."""
        if self._compressed or not self.gated:
            return None
        groups: dict[tuple, _ColumnGroup] = {}
        order: list[int] = []
        extras: list = []
        insert_op, update_op, delete_op = Op.INSERT, Op.UPDATE, Op.DELETE
        try:
            envelope, row_types, lane_shape, type_codes = _LANE_ENVELOPE.decode, ROW_TYPES, self._lane_shape, _TYPE_CODES
            placed: dict[tuple[int, str], tuple[_Shape, _ColumnGroup, int]] = {}  # shape, topic -> group, variant
            for msg in msgs:
                # A plain row message, read by msgspec against _LaneRow (types checked in C as _parse and _rows_head
                # check them); anything else (watermarks, DDL, a message _LaneRow does not describe) goes
                # through _parse.
                try:
                    m = envelope(msg.value)
                    op = row_types.get(m.type)
                except Exception:  # noqa: BLE001 - not a plain row message: _parse reads it (or says why not)
                    m = op = None
                if op is None or m.isDdl:
                    got = self._parse(msg)
                    if type(got) is not list:
                        return None  # a row message this path does not read (the record path says why)
                    ev = got[0]
                    if type(ev) is Resolved:
                        if not 0 <= ev.ts <= limit:
                            return None
                    elif type(ev) is DDL:  # kept as an event in its place, sized as decode_messages sizes it
                        if not 0 <= ev.commit_ts <= limit:
                            return None
                        ev.size = len(msg.value or b"") + len(msg.key or b"")
                    else:
                        return None
                    order.append(-1)
                    extras.append(ev)
                    continue
                tidb = m.tidb
                commit_ts = tidb.commitTs
                if not 0 <= commit_ts <= limit:
                    return None
                loc = tidb.claimCheckLocation
                if (loc is not None and loc != "") or (op is not delete_op and tidb.onlyHandleKey is True):
                    return None
                data = m.data
                n = len(data)
                if not n:
                    return None
                names = tuple(data[0])
                if n > 1:
                    for row in data:
                        if tuple(row) != names:
                            return None
                if op is update_op:
                    old = m.old
                    if old is None or len(old) != n:
                        return None
                    for row in old:
                        if tuple(row) != names:
                            return None
                schema = m.database or ""
                table = m.table or ""
                shape, kinds = lane_shape(schema, table, data[0], names, m.mysqlType, m.sqlType, m.pkNames)
                topic = msg.topic
                at = placed.get((id(shape), topic))
                if at is None or at[0] is not shape:  # (a shape's id is reused only after it was dropped)
                    if kinds is None:
                        return None
                    k = (schema, table, topic, names, kinds)
                    g = groups.get(k)
                    if g is None:
                        g = groups[k] = _ColumnGroup(schema, table, topic, names, kinds,
                                                     [shape.convs[c] for c in names], len(groups))
                    at = placed[(id(shape), topic)] = (shape, g, g.variant(shape.columns))
                g = at[1]
                g.meta.append((commit_ts, msg.partition, msg.offset,
                               (len(msg.value) + len(msg.key or b"")) // n, type_codes[m.type], at[2], n))
                g.rows += n
                if n == 1:  # TiCDC's own: one row per message (append, not a one-item list to extend with)
                    if op is insert_op:
                        g.befores.append(g.null_row)
                        g.afters.append(data[0])
                    elif op is delete_op:
                        g.befores.append(data[0])
                        g.afters.append(g.null_row)
                    else:  # before = the data row overlaid with old, which names every column in the same order
                        g.befores.append(m.old[0])
                        g.afters.append(data[0])
                    order.append(g.index)
                    continue
                if op is insert_op:
                    g.befores.extend([g.null_row] * n)
                    g.afters.extend(data)
                elif op is delete_op:
                    g.befores.extend(data)
                    g.afters.extend([g.null_row] * n)
                else:  # before = the data row overlaid with old, which names every column in the same order: old
                    g.befores.extend(m.old)
                    g.afters.extend(data)
                order.extend([g.index] * n)
            columns = V.SliceColumns(texts=True)  # _LaneRow let only str and null through
            shaped = []
            for g in groups.values():
                b = columns.add_all(g.kinds, g.convs, list(zip(*map(dict.values, g.befores))))
                a = columns.add_all(g.kinds, g.convs, list(zip(*map(dict.values, g.afters))))
                shaped.append((g, b, a))
            arrays = columns.convert()
            metas = [[] for _ in META_TYPES]
            for g, _, _ in shaped:
                if g.rows == len(g.meta):  # one row per message (TiCDC's own): the records are the columns
                    for m, v in zip(metas, zip(*g.meta)):
                        m.extend(v)
                else:
                    for rec in g.meta:
                        n = rec[6]
                        for m, v in zip(metas, rec):
                            m.extend((v,) * n)
            meta_arrays = [pa.array(v, t) for v, t in zip(metas, META_TYPES)]
            out = []
            at = 0
            for g, b, a in shaped:
                n = g.rows
                out.append(build_batch(g.shape(), [m.slice(at, n) for m in meta_arrays], [arrays[i] for i in b],
                                       [arrays[i] for i in a]))
                at += n
        except Exception:  # noqa: BLE001 - the record-by-record path raises the DecodeError that names it
            return None
        return ArrowSlice(len(msgs), order, out, extras)

    def _lane_shape(self, schema: str, table: str, first: dict, names: tuple[str, ...], mysql_text: msgspec.Raw,
                    sql_text: msgspec.Raw, pk_names: list | None) -> tuple[_Shape, tuple[str, ...] | None]:
        """:meth:`_shape` for :meth:`decode_arrow`, with the shape's Arrow kinds (None: a column no kind of
        :mod:`applier.columnar.values` holds), from the message's two maps as raw JSON. A recent shape of the table
        is a hit when its names and keys are the message's and both maps' texts parse to its maps
        (:class:`applier.codecs.canal_maps.MapMatch`: no dict is built). The shapes that already know the sqlType
        text are tried first: where two shapes of a table take turns (the same mysqlType, one column's sqlType
        code differing, TiCDC's unsigned promotion) that picks the right one without a failed parse, which costs
        an exception. Otherwise both maps are parsed as _LaneRow read them before (a mysqlType map of strings, not
        empty; sqlType null or a map of 64-bit integers or nulls; either raises, and the caller leaves the slice
        to the record path) and :meth:`_shape` finds or makes the shape."""
        if sql_text == _NULL:
            sql_text = _NO_SQL_TYPES
        recent = self._lane_recent.get((schema, table))
        if recent is not None:
            # A sqlType text a shape knows (TiCDC writes it in one order): no parse but mysqlType's. The mysqlType
            # check is MapMatch.__call__ written out: it runs once per message, and the call cost about 0.3 us more.
            for hit in recent:
                shape = hit.found[0]
                if (sql_text in hit.sql_types.texts and shape.names == names and shape.pk_names == pk_names
                        and (mysql_text in hit.mysql_types.texts or hit.mysql_types.parses(mysql_text))):
                    return hit.found
            for hit in recent:  # the shapes that do not know the sqlType text (the others were tried): the structs
                shape = hit.found[0]
                if (sql_text not in hit.sql_types.texts and shape.names == names and shape.pk_names == pk_names
                        and hit.sql_types.parses(sql_text) and hit.mysql_types(mysql_text)):
                    return hit.found
        mysql_types = _LANE_MYSQL_TYPES.decode(mysql_text)
        if not mysql_types:
            raise ValueError("no mysqlType map")  # the record path names it
        sql_types = _LANE_SQL_TYPES.decode(sql_text)
        shape = self._shape(schema, table, first, mysql_types, sql_types, pk_names)
        if shape.convert is None:
            kinds = None
        else:
            ks = tuple(V.kind_of(shape.convs[n]) for n in names)
            kinds = None if None in ks else ks
        hit = _LaneHit(shape, kinds, mysql_text, sql_text)
        if recent is None:
            if len(self._lane_recent) >= _SHAPE_CACHE_LIMIT:
                self._lane_recent.clear()
            self._lane_recent[(schema, table)] = [hit]
        else:
            recent.insert(0, hit)
            del recent[_SHAPES_PER_TABLE:]
        return hit.found

    # -- large messages (applier.codecs.largemsg) ---------------------------------------------------------------

    def _claim_checked(self, obj: dict, loc: Any, op: Op, etype: str, schema: str, table: str, commit_ts: int,
                       pos: Any, size: int) -> list:
        """The rows of the message a claim-check message points to (one file: the full message TiCDC would have
        sent, compressed like every value)."""
        name = f"`{schema}`.`{table}`"
        _, data = self._large.read_claim_check(loc, name)
        where = f"claim-check file {loc!r:.200} (for a row of {name})"
        if self._large.compressed:
            data = self._large.decompress(data, where)
        try:
            full = orjson.loads(data)
        except orjson.JSONDecodeError as e:
            raise _Bad(f"{where} does not hold a canal-json message: {e}") from None
        inner = full.get("_tidb") if type(full) is dict else None
        if (type(inner) is not dict or full.get("isDdl") is not False or full.get("type") != etype
                or full.get("database") != schema or full.get("table") != table or inner.get("commitTs") != commit_ts):
            got = full if type(full) is not dict else {f: full.get(f) for f in ("database", "table", "type")}
            raise _Bad(f"{where} holds {got!r:.200}, not the {etype} of {name} at commit ts {commit_ts} the "
                       "message names")
        if inner.get("claimCheckLocation") or inner.get("onlyHandleKey") is True:
            raise _Bad(f"{where} holds another large-message reference, not the full row")
        return self._rows(full, op, schema, table, commit_ts, pos, max(size, len(data)))

    def _from_upstream(self, obj: dict, op: Op, schema: str, table: str, commit_ts: int, pos: Any,
                       size: int) -> list:
        """Complete a handle-key-only INSERT/UPDATE: decode its key columns, read the new row as of the commit ts
        and an UPDATE's old row (by ``old``'s key) as of commit ts - 1, and decode them as the full message."""
        name = f"`{schema}`.`{table}`"
        up = self._large.need_upstream(name, f"{op.name} (_tidb.onlyHandleKey=true)")
        out = []
        for ev in self._rows(obj, op, schema, table, commit_ts, pos, size):
            key_new = ev.after or {}
            new = up.fetch(schema, table, commit_ts, key_new, "the new row")
            old = None
            if op is Op.UPDATE:
                key_old = {k: v for k, v in (ev.before or {}).items() if k in key_new}
                old = up.fetch(schema, table, commit_ts - 1, key_old or key_new, "the old row")
            full = _canal_message(obj, new, old)
            out.extend(self._rows(full, op, schema, table, commit_ts, pos, size))
        return out

    def _commit_ts(self, tidb: dict) -> int:
        if "commitTs" not in tidb:
            if self.require_tidb_extension:
                raise _Bad("'_tidb.commitTs' is missing")
            return 0
        ts = tidb["commitTs"]
        if type(ts) is not int or ts < 0:
            raise _Bad(f"'_tidb.commitTs' must be a non-negative integer (got {ts!r:.40})")
        return ts

    def _rows_head(self, obj: dict, op: Op, schema: str, table: str) -> tuple["_Shape", list, Any]:
        """A row message's shape, ``data`` and ``old``, checked."""
        data = obj.get("data")
        if type(data) is not list or not data:
            raise _Bad(f"{op.name} message has no rows in 'data'")
        mysql_types = obj.get("mysqlType")
        if type(mysql_types) is not dict or not mysql_types:
            raise _Bad(f"{op.name} message has no 'mysqlType' map")
        sql_types = obj.get("sqlType")
        if sql_types is None:
            sql_types = {}
        elif type(sql_types) is not dict:
            raise _Bad("'sqlType' must be an object")
        pk_names = obj.get("pkNames")
        if pk_names is not None and not (type(pk_names) is list and _all_str(pk_names)):
            raise _Bad("'pkNames' must be a list of strings or null")
        old = obj.get("old")
        if op is Op.UPDATE:
            if type(old) is not list or len(old) != len(data):
                raise _Bad(
                    f"UPDATE message needs 'old' parallel to 'data' ({len(data)} rows), got "
                    f"{'null' if old is None else type(old).__name__ if type(old) is not list else len(old)}"
                )

        first = data[0]
        if type(first) is not dict:
            raise _Bad("'data' rows must be objects")
        return self._shape(schema, table, first, mysql_types, sql_types, pk_names), data, old

    def _rows(self, obj: dict, op: Op, schema: str, table: str, commit_ts: int, pos: Any,
              size: int) -> list:
        shape, data, old = self._rows_head(obj, op, schema, table)
        cols = shape.columns
        convs = shape.convs
        convert = shape.convert
        names = shape.names

        n = len(data)
        per_row = size // n
        out = []
        for i in range(n):
            row = data[i]
            after = None
            if convert is not None and (i == 0 or (type(row) is dict and tuple(row) == names)):
                try:
                    after = convert(row.values())
                except Exception:  # noqa: BLE001 - the generic path below finds and names the culprit
                    pass
            if after is None:
                after = self._convert(row, convs, i, "data")
            # RowChange(schema, table, commit_ts, op, before, after, columns, position, size), positionally:
            # keyword arguments cost twice as much here (the field order is checked at import)
            if op is Op.UPDATE:
                o = old[i]
                prev = None
                if convert is not None and type(o) is dict and tuple(o) == names:
                    try:
                        prev = convert(o.values())
                    except Exception:  # noqa: BLE001
                        pass
                if prev is None:
                    prev = self._convert(o, convs, i, "old")
                before = dict(after)
                before.update(prev)
                out.append(RowChange(schema, table, commit_ts, op, before, after, cols, pos, per_row))
            elif op is Op.INSERT:
                out.append(RowChange(schema, table, commit_ts, op, None, after, cols, pos, per_row))
            else:
                out.append(RowChange(schema, table, commit_ts, op, after, None, cols, pos, per_row))
        return out

    def _shape(self, schema: str, table: str, first: dict, mysql_types: dict, sql_types: dict,
               pk_names: list | None) -> _Shape:
        """The columns and converters of a message, reused while what determines them stays the same: the
        first row's column names in order, the mysqlType and sqlType maps and the key names.

        Recent shapes are kept per table and matched by dict equality, which ignores the order of the maps
        (TiCDC writes mysqlType from a Go map, so its order changes from message to message) and costs less
        than hashing them. Equality would take a sqlType 4.0 or true for the 4 or 1 a shape was validated
        with, so the Python types of the sqlType values must match too."""
        names = tuple(first)
        code_types = tuple(map(type, sql_types.values()))
        recent = self._recent.get((schema, table))
        if recent is not None:
            for hit in recent:
                if (hit.names == names and hit.mysql_types == mysql_types and hit.sql_types == sql_types
                        and hit.code_types == code_types and hit.pk_names == pk_names):
                    return hit
        columns, convs = self._columns_of(first, mysql_types, sql_types, frozenset(pk_names or ()))
        if len(columns) != len(names):  # mysqlType names columns the first row lacks: rare, not kept
            return _Shape(columns, names, convs, None, mysql_types, sql_types, code_types, pk_names)
        conv_tuple = tuple(convs.values())
        convert = self._row_converters.get((names, conv_tuple))
        if convert is None:
            convert = T.row_converter(names, conv_tuple)
            if len(self._row_converters) >= _SHAPE_CACHE_LIMIT:
                self._row_converters.clear()
            self._row_converters[(names, conv_tuple)] = convert
        shape = _Shape(columns, names, convs, convert, mysql_types, sql_types, code_types, pk_names)
        if recent is None:
            if len(self._recent) >= _SHAPE_CACHE_LIMIT:
                self._recent.clear()
            self._recent[(schema, table)] = [shape]
        else:
            recent.insert(0, shape)
            del recent[_SHAPES_PER_TABLE:]
        return shape

    def _columns_of(self, first: dict, mysql_types: dict, sql_types: dict,
                    pk: frozenset) -> tuple[tuple[Column, ...], dict[str, Callable[[Any], Any]]]:
        # Column metadata: data order first (the table's column order; the mysqlType map is a Go map and
        # comes out in random order), then anything only mysqlType names.
        order = list(first)
        if len(order) != len(mysql_types) or any(n not in mysql_types for n in order):
            seen = set(order)
            order += [n for n in mysql_types if n not in seen]
        columns: list[Column] = []
        convs: dict[str, Callable[[Any], Any]] = {}
        cache = self._columns
        for name in order:
            spec = mysql_types.get(name)
            if type(spec) is not str:
                raise _Bad(f"column {name!r} has no mysqlType string")
            code = sql_types.get(name)
            ck = (name, spec, code, name in pk)
            try:
                hit = cache.get(ck)
            except TypeError:
                raise _Bad(f"column {name!r}: 'sqlType' must be an integer") from None
            if hit is None or (code is not None and type(code) is not int):  # 4.0 == 4: validate, never hit
                hit = self._new_column(name, spec, code, name in pk)
            columns.append(hit[0])
            convs[name] = hit[1]
        return tuple(columns), convs

    @staticmethod
    def _convert(row: Any, convs: dict, i: int, which: str) -> dict:
        try:
            return {name: (None if v is None else convs[name](v)) for name, v in row.items()}
        except Exception:  # noqa: BLE001 - find the culprit on the slow path
            pass
        if type(row) is not dict:
            raise _Bad(f"'{which}' row {i} is a JSON {type(row).__name__}, expected an object")
        for name, v in row.items():
            conv = convs.get(name)
            if conv is None:
                raise _Bad(f"'{which}' row {i}: column {name!r} is not in 'mysqlType'")
            if v is None:
                continue
            try:
                conv(v)
            except Exception as e:  # noqa: BLE001
                raise _Bad(f"'{which}' row {i}: column {name!r}: cannot decode {v!r:.80}: {e}") from None
        raise _Bad(f"'{which}' row {i} cannot be decoded")  # pragma: no cover - defensive

    def _new_column(self, name: str, spec: str, code: Any, is_pk: bool) -> tuple[Column, Callable]:
        if code is not None and type(code) is not int:
            raise _Bad(f"column {name!r}: 'sqlType' must be an integer (got {code!r:.40})")
        base, unsigned = T.split_mysql_type(spec)
        if base not in T.KNOWN_TYPES:
            raise _Bad(f"column {name!r}: unknown mysqlType {spec!r:.80}")
        if base == "geometry":
            raise _Bad(f"column {name!r}: GEOMETRY is not supported")
        # TiCDC tests the whole mysqlType string for "blob"/"binary"; the base name gives the same answer
        # for every type TiCDC writes and does not trip over enum('binary', ...) members.
        binary = base in T.BINARY_TYPES
        conv = _converter_for(base)
        col = Column(name=name, type_name=base, nullable=True, key=is_pk, unique=is_pk, unsigned=unsigned,
                     binary=binary, generated=False, type_code=code, declared=spec)
        if len(self._columns) >= _COLUMN_CACHE_LIMIT:
            self._columns.clear()
        hit = (col, conv)
        self._columns[(name, spec, code, is_pk)] = hit
        return hit
