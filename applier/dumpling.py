"""Reading a Dumpling export (TiDB's logical dump tool): its layout, its ``metadata``, its table schemas and its
data files, SQL or CSV. Pure: files in, Python values out; :mod:`applier.load` writes them to the target.

Layout (as Dumpling writes it; checked against pingcap/tidb ``dumpling/export``):

==========================================  ====================================================================
``metadata``                                start/finish times and the ``SHOW MASTER STATUS:`` block (``SHOW
                                            BINARY LOG STATUS:`` from servers that use the new terminology):
                                            ``Log: tidb-binlog`` and ``Pos: <TSO>`` for TiDB, a binlog file and
                                            offset for MySQL; a second block marked ``/* AFTER CONNECTION POOL
                                            ESTABLISHED */`` may follow, and ``SHOW SLAVE STATUS:`` blocks (a
                                            replica's upstream position, never the snapshot)
``{db}-schema-create.sql``                  CREATE DATABASE (not needed: target schemas come from the routes)
``{db}.{table}-schema.sql``                 ``/*!40101 SET NAMES binary*/;`` then the CREATE TABLE (MySQL/TiDB)
``{db}.{table}.{index}.sql``                ``INSERT INTO `t` [(`a`,`b`)] VALUES\\n(..),\\n(..);`` statements
``{db}.{table}.{index}.csv``                one record a line, a header line first unless ``--no-header``
``*-schema-view.sql``, ``-schema-post``,    views, routines, triggers, sequences, placement policies: not
``-schema-triggers``, ``-schema-sequence``  loaded (a view also has a ``-schema.sql`` placeholder table, which
``*-placement-policy-create.sql``           is skipped with it)
==========================================  ====================================================================

``{index}`` is 9 digits (13 with both ``--rows`` and ``--filesize``). Names are escaped for file systems:
``%XX`` for control characters, ``% " * . / : < > ? \\ |`` and the ``-`` of ``-schema``, so a ``.`` always
separates parts. With ``--compress`` every file gets ``.gz``, ``.zst`` or ``.snappy``: gzip is read directly,
the others are refused with the command that decompresses them.

Values (Dumpling's defaults, ``--escape-backslash`` on): SQL strings are ``'...'`` with backslash escapes
(``\\0 \\n \\r \\\\ \\' \\" \\Z``; ``''`` is accepted too, and with ``escape_backslash=False`` it is the only
escape), numbers and ``NULL`` are bare, binary columns (BINARY/VARBINARY/BLOB/BIT) are ``x'hex'``;
``_binary '...'``, ``0x..``, ``b'01'`` are read as MySQL reads them. CSV (``--csv-separator ,``,
``--csv-delimiter '"'``, ``--csv-null-value \\N``, ``\\r\\n`` line ends, ``\\n`` accepted): numbers bare,
strings and binary values (their raw bytes) between delimiters with ``\\0 \\r \\n \\\\`` and the delimiter
escaped by a backslash (doubled delimiters without ``escape_backslash``), NULL as the bare null value, so the
strings ``'NULL'`` and ``'\\N'`` stay strings.

A data file is read in blocks (a file can be many gigabytes), decoded as UTF-8 with ``surrogateescape`` so raw
binary bytes survive exactly (:func:`to_bytes`); :class:`RowBatch` carries each row's character offset, and
:func:`line_of` turns one into a line number only when an error needs it.
"""

from __future__ import annotations

import codecs
import gzip
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Iterator, Sequence
from urllib.parse import unquote

from applier.ddl.lexer import Cursor, LexError, Statement, split_statements
from applier.ddl.syntax import column_list
from applier.ddl.tidb import neutralise_tidb
from applier.mysql_values import binary_type_name, canonical_type_name

__all__ = [
    "ExportError", "Metadata", "DataFile", "TableExport", "Export", "SourceColumn", "TableDef", "ReadOptions",
    "RowBatch", "parse_metadata", "scan", "unfinished", "cut_short", "parse_table_schema", "read_rows", "line_of", "to_bytes",
    "unescape_sql", "split_data_name",
]


class ExportError(Exception):
    """The export cannot be read as it is; the message names the file (and line) and what to do."""


# ---------------------------------------------------------------------------------------------------------
# metadata


@dataclass(frozen=True)
class Metadata:
    """The position block of ``metadata``: for TiDB ``log`` is ``tidb-binlog`` and ``pos`` the snapshot TSO."""

    log: str | None = None
    pos: str | None = None
    gtid: str | None = None
    started: str | None = None
    finished: str | None = None

    @property
    def snapshot_ts(self) -> int | None:
        """TiDB's snapshot TSO, or None (a MySQL export's binlog position is no TSO)."""
        if self.log != "tidb-binlog" or not self.pos or not self.pos.isdigit():
            return None
        ts = int(self.pos)
        return ts if 0 < ts < 1 << 63 else None


_STATUS_HEADER = re.compile(r"SHOW (?:MASTER|BINARY LOG) STATUS:(.*)$")


def parse_metadata(text: str) -> Metadata:
    """Read ``metadata``. Of the master-status blocks, the one recorded after the connection pool was
    established wins when there is one (it is the position every dump connection saw); ``SHOW SLAVE STATUS:``
    blocks describe a replica's own upstream and are ignored."""
    blocks: list[tuple[bool, dict[str, str]]] = []
    started = finished = None
    current: dict[str, str] | None = None
    for line in text.splitlines():
        if line.startswith("Started dump at:"):
            started = line.split(":", 1)[1].strip()
        elif line.startswith("Finished dump at:"):
            finished = line.split(":", 1)[1].strip()
        m = _STATUS_HEADER.match(line)
        if m is not None:
            current = {}
            blocks.append(("AFTER CONNECTION POOL" in m.group(1), current))
            continue
        if line[:1] in ("\t", " ") and current is not None and ":" in line:
            k, v = line.strip().split(":", 1)
            current.setdefault(k.strip().lower(), v.strip())
        elif line.strip() == "" or not line[:1].isspace():
            current = None
    chosen = next((b for after, b in blocks if after), blocks[0][1] if blocks else {})
    return Metadata(log=chosen.get("log"), pos=chosen.get("pos"), gtid=chosen.get("gtid"), started=started,
                    finished=finished)


# ---------------------------------------------------------------------------------------------------------
# layout

_COMPRESSION = {".gz": "gzip", ".gzip": "gzip", ".zst": "zstd", ".zstd": "zstd", ".snappy": "snappy"}
_NOT_LOADED = ("-schema-view.sql", "-schema-triggers.sql", "-schema-trigger.sql", "-schema-post.sql",
               "-schema-sequence.sql", "-placement-policy-create.sql")
_INDEX = re.compile(r"\d+")
_ODD_NAMES = "names not in Dumpling's {db}.{table}.{index} form (a custom --output-filename-template, or --sql?)"


@dataclass(frozen=True)
class DataFile:
    path: Path
    schema: str
    table: str
    index: str
    format: str  # "sql" | "csv"
    compression: str = ""  # "" | "gzip"

    @property
    def name(self) -> str:
        return self.path.name


@dataclass
class TableExport:
    schema: str
    table: str
    schema_file: Path | None = None
    data: list[DataFile] = field(default_factory=list)


@dataclass
class Export:
    root: Path
    metadata: Metadata | None
    tables: dict[tuple[str, str], TableExport]
    not_loaded: list[str] = field(default_factory=list)  # views, routines, ...: named, not loaded
    unknown: list[str] = field(default_factory=list)  # files that are no part of Dumpling's layout


def unescape_name(part: str) -> str:
    """A database or table name as Dumpling escaped it for a file name (``%2E`` for ``.``, ...)."""
    return unquote(part, errors="strict") if "%" in part else part


def split_data_name(stem: str) -> tuple[str, str, str] | None:
    """``db.table.000000001`` -> (db, table, index), names unescaped; None when it is no data file name."""
    parts = stem.split(".")
    if len(parts) != 3 or not parts[0] or not parts[1] or _INDEX.fullmatch(parts[2]) is None:
        return None
    return unescape_name(parts[0]), unescape_name(parts[1]), parts[2]


def _split_table_name(base: str) -> tuple[str, str] | None:
    parts = base.split(".")
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return unescape_name(parts[0]), unescape_name(parts[1])


def scan(root: Path) -> Export:
    """The export's files, classified. Raises :class:`ExportError` for a folder that is no Dumpling export, a
    data file in a format this reader does not take, or compression other than gzip."""
    if not root.is_dir():
        raise ExportError(f"{root} is not a folder: give --dumpling the folder Dumpling wrote (its -o/--output)")
    tables: dict[tuple[str, str], TableExport] = {}
    metadata: Metadata | None = None
    not_loaded: list[str] = []
    unknown: list[str] = []
    unreadable: dict[str, list[str]] = {}
    views: set[tuple[str, str]] = set()
    for path in sorted(p for p in root.iterdir() if p.is_file()):
        name = path.name
        if name == "metadata":
            metadata = parse_metadata(path.read_text(encoding="utf-8", errors="replace"))
            continue
        suffix = path.suffix.lower()
        compression = _COMPRESSION.get(suffix, "")
        plain = name[: -len(suffix)] if compression else name
        if compression and compression != "gzip":
            unreadable.setdefault(compression, []).append(name)
            continue
        if plain.endswith(_NOT_LOADED):
            not_loaded.append(name)
            if plain.endswith("-schema-view.sql"):
                t = _split_table_name(plain[: -len("-schema-view.sql")])
                if t is not None:
                    views.add(t)
            continue
        if plain.endswith("-schema-create.sql"):
            continue
        if plain.endswith("-schema.sql"):
            t = _split_table_name(plain[: -len("-schema.sql")])
            if t is None:
                unreadable.setdefault(_ODD_NAMES, []).append(name)
                continue
            tables.setdefault(t, TableExport(*t)).schema_file = path
            continue
        stem, dot, ext = plain.rpartition(".")
        parts = split_data_name(stem) if dot else None
        if parts is None:
            if ext.lower() in ("sql", "csv"):  # data of some table, but which? loading without it would lose it
                unreadable.setdefault(_ODD_NAMES, []).append(name)
            else:
                unknown.append(name)
            continue
        if ext.lower() not in ("sql", "csv"):
            unreadable.setdefault(f"{ext} files", []).append(name)
            continue
        schema, table, index = parts
        tables.setdefault((schema, table), TableExport(schema, table)).data.append(
            DataFile(path, schema, table, index, ext.lower(), compression))
    if unreadable:
        what = "; ".join(f"{kind}: {', '.join(sorted(names)[:5])}{' ...' if len(names) > 5 else ''}"
                         for kind, names in sorted(unreadable.items()))
        raise ExportError(
            f"{root} holds files this loader cannot read ({what}). It reads .sql and .csv data, plain or gzip "
            "(.gz), named as Dumpling names them by default: decompress zstd/snappy files first (`zstd -d --rm "
            "FILE.zst`, `snappy`-aware tools), or export again with Dumpling's --filetype sql|csv, --compress gzip "
            "(or no --compress) and no --output-filename-template")
    for v in views:
        tables.pop(v, None)
    if metadata is None and not tables:
        raise ExportError(f"{root} has no Dumpling 'metadata' file and no table files: is it a Dumpling export?")
    for t in tables.values():
        t.data.sort(key=lambda f: (len(f.index), f.index, f.format))
    return Export(root, metadata, dict(sorted(tables.items())), not_loaded, unknown)


def unfinished(export: Export) -> str | None:
    """Why ``export`` is not a finished Dumpling export, or None. Dumpling writes ``metadata`` last, in one piece
    with its ``Finished dump at:`` line, and only when every table was dumped (``dumpling/export/dump.go``: the
    deferred ``writeGlobalMetaData`` runs only when ``Dump`` returns no error): an export without it was cut
    short (Dumpling stopped, killed or failed, or still running), and its last data files may end mid-row and
    whole tables may be missing, which no check of the files can see."""
    root = export.root
    if export.metadata is None:
        why = "has no 'metadata' file"
    elif export.metadata.finished is None:
        why = "has a 'metadata' file without its 'Finished dump at:' line"
    else:
        return None
    return (f"{root} {why}: Dumpling writes that file last, once every table is dumped, so this export is "
            "unfinished (Dumpling was stopped or failed, or is still running) and its tables may be cut short or "
            "missing. Take the export again and load it once Dumpling has finished (its metadata file then ends "
            "with 'Finished dump at:'); nothing was loaded")


def cut_short(f: DataFile) -> str | None:
    """Why data file ``f`` ends where no file of Dumpling's ends, or None. Dumpling ends every INSERT statement of
    an SQL file with ``;`` and every CSV record with a line break (``--csv-line-terminator``, ``\\r\\n`` by
    default), so a file that stops elsewhere was cut short: Dumpling stopped while writing it, or the copy of the
    export is incomplete. A gzip file is read to its end (decompression only: cheap beside the load), which also
    finds a stream cut short. Checked for every file before anything is written, so a cut file loads nothing."""
    tail = b""
    try:
        if f.compression == "gzip":
            with gzip.open(f.path, "rb") as fh:
                while True:
                    chunk = fh.read(1 << 20)
                    if not chunk:
                        break
                    tail = (tail + chunk)[-64:]
        else:
            with open(f.path, "rb") as fh:
                size = fh.seek(0, 2)
                fh.seek(max(0, size - 64))
                tail = fh.read()
    except (OSError, EOFError) as exc:  # a gzip stream that stops before its end, or no gzip at all
        return f"{f.name} cannot be read to its end ({exc})"
    end = tail.rstrip(b" \t\r\n") if f.format == "sql" else tail
    if not end:
        return None  # an empty file holds no row to lose
    if f.format == "sql" and not end.endswith(b";"):
        return f"{f.name} ends in the middle of a statement (its last bytes: {tail[-24:]!r:.60})"
    if f.format == "csv" and not end.endswith(b"\n"):
        return f"{f.name} ends in the middle of a record (its last bytes: {tail[-24:]!r:.60})"
    return None


# ---------------------------------------------------------------------------------------------------------
# table schemas


@dataclass(frozen=True)
class SourceColumn:
    name: str
    type: str  # canonical MySQL type name ("varchar"; "varbinary" for a varchar with the binary charset)
    full: str  # the type as declared, for messages ("decimal(12,2)")
    unsigned: bool = False
    generated: bool = False


@dataclass
class TableDef:
    create_sql: str  # the CREATE TABLE statement as the export has it
    columns: list[SourceColumn]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]


def read_text(path: Path, compression: str = "") -> str:
    opener: Any = gzip.open if compression == "gzip" or path.suffix.lower() in (".gz", ".gzip") else open
    with opener(path, "rb") as fh:
        data = fh.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ExportError(f"{path.name}: not UTF-8 at byte {exc.start}: {exc.reason}") from None


def parse_table_schema(text: str, *, where: str) -> TableDef:
    """The CREATE TABLE of a ``-schema.sql`` file (after Dumpling's ``SET NAMES`` comment) and its columns,
    read with the grammar the applier's DDL translators use."""
    try:
        for stmt in split_statements(text):
            sig = Statement.lex(neutralise_tidb(stmt)).sig
            c = Cursor(sig)
            if not c.accept_kw("CREATE"):
                continue
            c.accept_kw("TEMPORARY")
            if not c.accept_kw("TABLE"):
                continue
            c.accept_seq("IF", "NOT", "EXISTS")
            c.ident()
            if c.accept_op("."):
                c.ident()
            if c.is_kw("LIKE") or (c.is_op("(") and c.is_kw("LIKE", k=1)):
                raise ExportError(f"{where}: CREATE TABLE ... LIKE names no columns; export the table's own schema")
            defs, _indexes = column_list(c)
            cols = []
            for d in defs:
                base = canonical_type_name(d.type.name)
                if base == "serial":
                    base = "bigint"
                if d.type.charset == "binary":
                    base = binary_type_name(base, True)
                full = d.type.name + (f"({','.join(d.type.args)})" if d.type.args else "")
                cols.append(SourceColumn(d.name, base, full, unsigned=d.type.unsigned or d.type.name == "serial",
                                         generated=d.generated))
            return TableDef(stmt, cols)
    except LexError as exc:
        raise ExportError(f"{where}: its CREATE TABLE cannot be read: {exc}") from None
    raise ExportError(f"{where}: no CREATE TABLE statement in it")


# ---------------------------------------------------------------------------------------------------------
# values

_SQL_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a", "%": "\\%", "_": "\\_"}
_SQL_ESCAPE = re.compile(r"\\(.)|''", re.S)


def _sql_escape(m: re.Match[str]) -> str:
    c = m.group(1)
    return "'" if c is None else _SQL_ESCAPES.get(c, c)


def unescape_sql(s: str, escape_backslash: bool = True) -> str:
    """The content of a MySQL ``'...'`` literal: backslash escapes as MySQL reads them (``\\%``/``\\_`` keep
    their backslash; any other escaped character is itself) and doubled quotes."""
    if escape_backslash:
        return _SQL_ESCAPE.sub(_sql_escape, s) if "\\" in s or "''" in s else s
    return s.replace("''", "'")


def to_bytes(v: str) -> bytes:
    """A value read from the export as the bytes it was: text was decoded with ``surrogateescape``."""
    return v.encode("utf-8", "surrogateescape")


_SURROGATE = re.compile("[\udc80-\udcff]")


def has_undecodable(s: str) -> bool:
    """Whether ``s`` holds bytes that were not UTF-8 (as ``surrogateescape`` surrogates)."""
    return _SURROGATE.search(s) is not None


class BitLiteral(int):
    """``b'0101'``: a bit-value literal (an int, told apart from a number's text)."""


_NUMBER_START = frozenset("0123456789-+.")


def _sql_bare(raw: str) -> Any:
    """A bare SQL token: NULL -> None, a number stays its text, ``0x..``/``x'..'`` -> bytes, ``b'..'``/``0b..``
    -> BitLiteral."""
    c = raw[0]
    if c in _NUMBER_START and not (c == "0" and raw[1:2] in ("x", "X", "b", "B")):
        return raw
    up = raw[:2].upper()
    if raw.upper() == "NULL":
        return None
    if up == "X'":
        return bytes.fromhex(raw[2:-1])
    if up == "0X":
        h = raw[2:]
        return bytes.fromhex(h if len(h) % 2 == 0 else "0" + h)
    if up == "B'":
        return BitLiteral(int(raw[2:-1] or "0", 2))
    if up == "0B":
        return BitLiteral(int(raw[2:], 2))
    if raw.upper() in ("TRUE", "FALSE"):
        return "1" if raw.upper() == "TRUE" else "0"
    return raw


# ---------------------------------------------------------------------------------------------------------
# data files


@dataclass(frozen=True)
class ReadOptions:
    """How the export was written: Dumpling's ``--escape-backslash`` and CSV options (defaults are its own)."""

    escape_backslash: bool = True
    csv_separator: str = ","
    csv_delimiter: str = '"'
    csv_null: str = "\\N"
    csv_header: str = "auto"  # auto | yes | no

    def check(self) -> str | None:
        """What is wrong with these options, or None."""
        if not self.csv_separator or "\n" in self.csv_separator or "\r" in self.csv_separator:
            return "--csv-separator must be a non-empty string without line breaks"
        if len(self.csv_delimiter) != 1 or self.csv_delimiter in self.csv_separator + "\r\n\\":
            return ("--csv-delimiter must be one character, not part of the separator (exports written with an "
                    "empty --csv-delimiter cannot be read back unambiguously)")
        if self.csv_header not in ("auto", "yes", "no"):
            return "--csv-header must be auto, yes or no"
        return None


@dataclass
class RowBatch:
    """Rows of one data file with one column list. ``columns`` is the file's own list (an INSERT's column list,
    a CSV header) or None (the table's columns). A value is None (NULL), str (text: a number's digits too),
    bytes (a hex or ``_binary`` literal) or :class:`BitLiteral`. ``offsets``: each row's character offset in
    the decoded file (:func:`line_of`). ``undecodable``: the text had bytes that are not UTF-8."""

    columns: tuple[str, ...] | None
    rows: list[list[Any]]
    offsets: list[int]
    undecodable: bool = False


BLOCK_BYTES = 8 << 20
MAX_PENDING_CHARS = 256 << 20  # one row (or an unterminated quote) larger than this is an error
_SPACE = re.compile(r"\s*")


class _Text:
    """A data file as decoded text, appended block by block; ``base`` is the offset of ``text[0]``."""

    def __init__(self, f: DataFile, block: int = BLOCK_BYTES) -> None:
        self.f = f
        self.block = block
        self.fh: IO[bytes] = gzip.open(f.path, "rb") if f.compression == "gzip" else open(f.path, "rb")
        self.dec = codecs.getincrementaldecoder("utf-8")("surrogateescape")
        self.text = ""
        self.pos = 0
        self.base = 0
        self.eof = False
        self.undecodable = False

    def close(self) -> None:
        self.fh.close()

    def more(self) -> bool:
        """Append the next block (dropping what was consumed); False at the end of the file."""
        if self.eof:
            return False
        try:
            data = self.fh.read(self.block)
        except (OSError, EOFError) as exc:
            raise ExportError(f"{self.f.name}: cannot be read: {exc}") from None
        chunk = self.dec.decode(data, final=not data)
        if not data:
            self.eof = True
        if chunk and not self.undecodable and has_undecodable(chunk):
            self.undecodable = True
        if self.pos:
            self.text = self.text[self.pos:]
            self.base += self.pos
            self.pos = 0
        if len(self.text) > MAX_PENDING_CHARS:
            raise self.error("a row longer than 256 MiB, or an unterminated quoted value, starts here")
        self.text += chunk
        return bool(chunk) or not self.eof

    def error(self, what: str, offset: int | None = None) -> ExportError:
        """An error at ``offset``, by default where reading stands (past any white space)."""
        off = self.base + _SPACE.match(self.text, self.pos).end() if offset is None else offset
        return ExportError(f"{self.f.name}, line {line_of(self.f, off)}: {what}")

    def ahead(self, n: int = 40) -> str:
        """What comes next (for messages)."""
        return self.text[self.pos:self.pos + n + 200].lstrip()[:n]


def line_of(f: DataFile, offset: int) -> int:
    """The line (1-based) of character ``offset`` of the decoded file (read again: only errors need it)."""
    t = _Text(f)
    try:
        line = 1
        seen = 0
        while True:
            t.more()
            chunk = t.text
            if seen + len(chunk) >= offset or t.eof:
                return line + chunk.count("\n", 0, max(0, offset - seen))
            line += chunk.count("\n")
            seen += len(chunk)
            t.text = ""
    finally:
        t.close()


def read_rows(f: DataFile, opts: ReadOptions, *, table_columns: Sequence[str], batch_rows: int = 5000,
              block: int = BLOCK_BYTES) -> Iterator[RowBatch]:
    """The rows of one data file, in batches of at most ``batch_rows``. Raises :class:`ExportError` naming the
    file and line for anything that is not Dumpling's syntax."""
    t = _Text(f, block)
    try:
        if f.format == "sql":
            yield from _sql_rows(t, opts, f, batch_rows)
        else:
            yield from _csv_rows(t, opts, table_columns, batch_rows)
    finally:
        t.close()


# -- SQL ----------------------------------------------------------------------------------------------------

_NAME = r"`(?:[^`]|``)+`|[A-Za-z0-9_$\u0080-\uffff]+"
_SKIP = re.compile(r"(?:\s+|/\*.*?\*/(?:\s*;)?|--[^\n]*\n|#[^\n]*\n)*", re.S)
_INSERT = re.compile(
    rf"INSERT\s+(?:IGNORE\s+)?INTO\s+({_NAME})(?:\s*\.\s*({_NAME}))?\s*"
    rf"(?:\(\s*((?:(?:{_NAME})\s*,\s*)*(?:{_NAME}))\s*\))?\s*VALUES\s*", re.I)
_COLUMN = re.compile(r"`((?:[^`]|``)+)`|([A-Za-z0-9_$\u0080-\uffff]+)")
_HEXBIT = r"[xX]'[0-9A-Fa-f]*'|[bB]'[01]*'"
_BARE = r"[^\s,()'\"`]+"
_PLAIN_NUMBER = r"-?[0-9]+(?:\.[0-9]*)?(?:[eE][-+]?[0-9]+)?"


def _sql_patterns(escape_backslash: bool) -> tuple[re.Pattern[str], re.Pattern[str]]:
    body = r"(?:[^'\\]|\\.|'')*" if escape_backslash else r"(?:[^']|'')*"
    string = f"'{body}'"
    value = rf"(?:{string}|_[A-Za-z0-9]+\s*{string}|{_HEXBIT}|{_BARE})"
    row = re.compile(rf"\s*\(\s*({value}(?:\s*,\s*{value})*)\s*\)\s*([,;])", re.S)
    # one group per kind, so findall's tuples say which it was (all empty: the empty string '')
    tokens = re.compile(rf"({_PLAIN_NUMBER})(?=[\s,]|$)|'({body})'|[xX]'([0-9A-Fa-f]*)'|_[A-Za-z0-9]+\s*'({body})'|"
                        rf"([bB]'[01]*'|{_BARE})", re.S)
    return row, tokens


_SQL_PATTERNS = {True: _sql_patterns(True), False: _sql_patterns(False)}


def _ident(tok: str) -> str:
    return tok[1:-1].replace("``", "`") if tok.startswith("`") else tok


def _sql_rows(t: _Text, opts: ReadOptions, f: DataFile, batch_rows: int) -> Iterator[RowBatch]:
    row_re, tok_re = _SQL_PATTERNS[opts.escape_backslash]
    esc = opts.escape_backslash
    rows: list[list[Any]] = []
    offsets: list[int] = []
    columns: tuple[str, ...] | None = None
    in_values = False
    t.more()
    while True:
        text = t.text
        if not in_values:
            m = _SKIP.match(text, t.pos)
            if m.end() == len(text):
                if t.more():
                    continue  # a comment may go on in the next block: skip it whole
                break
            t.pos = m.end()
            m = _INSERT.match(text, t.pos)
            if m is None or m.end() == len(text):
                if not t.eof and len(text) - t.pos < 1 << 16:
                    t.more()
                    continue
                if m is None:
                    raise t.error(f"expected INSERT INTO ... VALUES, found {t.ahead()!r}")
            table = _ident(m.group(2) or m.group(1))
            if table != f.table:
                raise t.error(f"the INSERT is into `{table}`, but the file name says table `{f.table}`")
            new_cols = (tuple(a.replace("``", "`") if a else b for a, b in _COLUMN.findall(m.group(3)))
                        if m.group(3) else None)
            if new_cols != columns and rows:
                yield RowBatch(columns, rows, offsets, t.undecodable)
                rows, offsets = [], []
            columns = new_cols
            t.pos = m.end()
            in_values = True
            continue
        m = row_re.match(text, t.pos)
        if m is None:
            if t.more():
                continue
            raise t.error(f"expected a row of values such as (1,'a',NULL), found {t.ahead()!r}"
                          + (" (the file ends inside a statement: is it complete?)" if t.eof else ""))
        offsets.append(t.base + m.start(1))
        vals: list[Any] = []
        for num, q, hx, intro, raw in tok_re.findall(m.group(1)):
            if num:
                vals.append(num)
            elif hx:
                vals.append(bytes.fromhex(hx))
            elif raw:
                vals.append(_sql_bare(raw))
            elif intro:
                vals.append(to_bytes(unescape_sql(intro, esc)))
            elif "\\" in q or "''" in q:
                vals.append(unescape_sql(q, esc))
            else:
                vals.append(q)
        rows.append(vals)
        t.pos = m.end()
        if m.group(2) == ";":
            in_values = False
        if len(rows) >= batch_rows:
            yield RowBatch(columns, rows, offsets, t.undecodable)
            rows, offsets = [], []
    if in_values:
        raise t.error("the file ends inside an INSERT statement: is it complete?")
    if rows:
        yield RowBatch(columns, rows, offsets, t.undecodable)


# -- CSV ----------------------------------------------------------------------------------------------------


def _csv_patterns(opts: ReadOptions) -> tuple[re.Pattern[str], re.Pattern[str]]:
    d = re.escape(opts.csv_delimiter)
    sep = re.escape(opts.csv_separator)
    quoted = f"{d}(?:[^{d}\\\\]|\\\\.)*{d}" if opts.escape_backslash else f"{d}(?:[^{d}]|{d}{d})*{d}"
    if len(opts.csv_separator) == 1:
        bare = f"[^{sep}{d}\\r\\n]*"
    else:
        bare = f"(?:(?!{sep})[^{d}\\r\\n])*"
    field_ = f"(?:{quoted}|{bare})"
    record = re.compile(f"({field_}(?:{sep}{field_})*)\\r?\\n", re.S)
    fields = re.compile(f"(?:^|{sep})(?:({quoted})|({bare}))", re.S)
    return record, fields


_CSV_ESCAPES = {"0": "\0", "b": "\b", "n": "\n", "r": "\r", "t": "\t", "Z": "\x1a"}
_CSV_ESCAPE = re.compile(r"\\(.)", re.S)


def _csv_escape(m: re.Match[str]) -> str:
    c = m.group(1)
    return _CSV_ESCAPES.get(c, c)


def _csv_rows(t: _Text, opts: ReadOptions, table_columns: Sequence[str], batch_rows: int) -> Iterator[RowBatch]:
    record_re, field_re = _csv_patterns(opts)
    esc = opts.escape_backslash
    d = opts.csv_delimiter
    dd = d + d
    null = opts.csv_null
    known = set(table_columns)
    rows: list[list[Any]] = []
    offsets: list[int] = []
    columns: tuple[str, ...] | None = None
    first = True
    t.more()
    while True:
        text = t.text
        if t.pos == len(text) and not t.more():
            break
        text = t.text
        m = record_re.match(text, t.pos)
        if m is None:
            if t.more():
                continue
            text = t.text
            rest = text[t.pos:]
            m = record_re.match(rest + "\n") if rest else None
            if m is None:
                raise t.error(f"expected a CSV record, found {t.ahead()!r} (an unbalanced {d} or a stray line "
                              "break?); check --csv-separator, --csv-delimiter and --no-escape-backslash")
            start, end = t.pos, len(text)
        else:
            start, end = t.pos, m.end()
        vals: list[Any] = []
        quoted_all = True
        for q, bare in field_re.findall(m.group(1)):
            if q:
                s = q[1:-1]
                if esc:
                    if "\\" in s:
                        s = _CSV_ESCAPE.sub(_csv_escape, s)
                elif dd in s:
                    s = s.replace(dd, d)
                vals.append(s)
            else:
                quoted_all = False
                vals.append(None if bare == null else bare)
        t.pos = end
        if first:
            first = False
            header = opts.csv_header == "yes" or (
                opts.csv_header == "auto" and quoted_all and len(set(vals)) == len(vals) and set(vals) <= known)
            if header:
                columns = tuple("" if v is None else v for v in vals)
                continue
        offsets.append(t.base + start)
        rows.append(vals)
        if len(rows) >= batch_rows:
            yield RowBatch(columns, rows, offsets, t.undecodable)
            rows, offsets = [], []
    if rows:
        yield RowBatch(columns, rows, offsets, t.undecodable)
