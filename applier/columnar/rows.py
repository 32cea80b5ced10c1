"""The columnar lane's contract: a slice of Kafka records decoded into Arrow record batches, and the way back
to events.

A :class:`RowBatch` holds the row changes of one *shape*: one upstream table, one op, one Column tuple, one set
of image column names, one topic. Its record batch has a row per row change, in record order: ``_ts`` (commit
ts), ``_part``, ``_off`` (its Kafka position), ``_size`` (its share of the record's bytes, what the gate's
memory budget counts), then the before image's columns as ``b:<name>`` and the after image's as ``a:<name>``
(an op without that image has none of them). Each image column holds its values as :mod:`.values` made them
(``kinds``), so :meth:`RowBatch.to_events` gives back exactly the RowChange events the codec's per-record
decoder gives.

An :class:`ArrowSlice` is what a codec's ``decode_arrow`` gives for a slice of records: the batches, and for
each event in record order either its batch or -1 for the next of ``extras`` (events kept as objects:
watermarks). It travels from a Spark worker to the driver as Arrow IPC (:func:`encode_slice`).
"""

from __future__ import annotations

import itertools
import pickle
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

import pyarrow as pa

from applier.columnar import values as V
from applier.events import Column, Event, Op, RowChange, SourcePosition

META = ("_ts", "_part", "_off", "_size", "_op", "_var")
META_TYPES = (pa.int64(), pa.int32(), pa.int64(), pa.int64(), pa.int8(), pa.int16())
OPS = (Op.INSERT, Op.UPDATE, Op.DELETE)  # _op codes
OP_CODE = {op: i for i, op in enumerate(OPS)}


@dataclass(frozen=True)
class Shape:
    """What every row change of a :class:`RowBatch` shares: its table, topic, image column names and how each
    column is held (:mod:`.values` kinds); ``variants`` are the Column tuples its rows carry (``_var`` picks one:
    TiCDC's Canal-JSON gives an INT UNSIGNED column sqlType INT or BIGINT by the value, so one table's rows carry
    two)."""

    schema: str
    table: str
    topic: str
    names: tuple[str, ...]
    kinds: tuple[str, ...]
    variants: tuple[tuple[Column, ...], ...]


@dataclass
class RowBatch:
    """The row changes of one shape, as one record batch: ``_ts``, ``_part``, ``_off``, ``_size``, ``_op`` (0 insert,
    1 update, 2 delete), ``_var``, then ``b:<name>`` (the before image: null for an insert) and ``a:<name>`` (the
    after image: null for a delete) of every column."""

    shape: Shape
    data: pa.RecordBatch

    def __len__(self) -> int:
        return self.data.num_rows

    def to_events(self) -> list[RowChange]:
        """The row changes, as the codec's per-record decoder gives them."""
        sh, d = self.shape, self.data
        n = d.num_rows
        ts, parts, offs, sizes, ops, var = (d.column(c).to_pylist() for c in META)
        names = sh.names
        images = []
        for prefix, absent in (("b:", 0), ("a:", 2)):
            cols = [V.to_python(k, None, d.column(prefix + name)) for name, k in zip(names, sh.kinds)]
            if names:
                dicts = list(map(dict, map(zip, itertools.repeat(names), zip(*cols))))
            else:
                dicts = [{} for _ in range(n)]
            images.append([None if o == absent else im for o, im in zip(ops, dicts)])
        positions = map(SourcePosition, itertools.repeat(sh.topic), parts, offs)
        return list(map(RowChange, itertools.repeat(sh.schema), itertools.repeat(sh.table), ts,
                        map(OPS.__getitem__, ops), images[0], images[1], map(sh.variants.__getitem__, var),
                        positions, sizes))


def build_batch(shape: Shape, meta: Sequence[Any], before: Sequence[pa.Array], after: Sequence[pa.Array]) -> RowBatch:
    """A RowBatch from its columns: the META columns (lists or Arrow arrays), then both images' arrays in name
    order."""
    arrays = [v if isinstance(v, pa.Array) else pa.array(v, t) for v, t in zip(meta, META_TYPES)]
    arrays.extend(before)
    arrays.extend(after)
    names = [*META, *("b:" + n for n in shape.names), *("a:" + n for n in shape.names)]
    return RowBatch(shape, pa.RecordBatch.from_arrays(arrays, names=names))


def concat_batches(batches: Sequence[RowBatch]) -> RowBatch:
    """Batches of one table, topic, names and kinds as one (their variants merged, ``_var`` renumbered); the Arrow
    types of a column must agree (else ValueError)."""
    if len(batches) == 1:
        return batches[0]
    first = batches[0].shape
    variants: list[tuple[Column, ...]] = []
    at: dict[int, int] = {}
    datas = []
    for b in batches:
        remap = []
        for v in b.shape.variants:
            k = at.get(id(v))
            if k is None:
                k = next((i for i, w in enumerate(variants) if w is v or w == v), None)
                if k is None:
                    k = len(variants)
                    variants.append(v)
                at[id(v)] = k
            remap.append(k)
        d = b.data
        if remap != list(range(len(remap))):
            i = d.schema.get_field_index("_var")
            d = d.set_column(i, "_var", pa.array(remap, pa.int16()).take(d.column(i)))
        datas.append(d)
    table = pa.Table.from_batches(datas)  # raises when the schemas differ
    data = table.combine_chunks().to_batches()[0] if table.num_rows else datas[0]
    return RowBatch(replace(first, variants=tuple(variants)), data)


@dataclass
class ArrowSlice:
    """A slice of records decoded into batches (see the module docstring)."""

    messages: int
    order: list[int]
    batches: list[RowBatch]
    extras: list[Event]

    def to_events(self) -> list[Event]:
        """Every event of the slice in record order, as the per-record decoder gives them."""
        streams = [iter(b.to_events()) for b in self.batches]
        streams.append(iter(self.extras))
        return list(map(next, map(streams.__getitem__, self.order)))


def encode_slice(s: ArrowSlice) -> bytes:
    """The slice as bytes for the driver: the shapes, order and extras pickled, each batch as Arrow IPC."""
    ipc = []
    for b in s.batches:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, b.data.schema) as w:
            w.write_batch(b.data)
        ipc.append(sink.getvalue().to_pybytes())
    return pickle.dumps((s.messages, [b.shape for b in s.batches], ipc, s.order, s.extras), protocol=5)


def decode_slice(data: bytes) -> ArrowSlice:
    messages, shapes, ipc, order, extras = pickle.loads(data)
    batches = []
    for sh, buf in zip(shapes, ipc):
        batches.append(RowBatch(sh, pa.ipc.open_stream(buf).read_next_batch()))
    return ArrowSlice(messages, order, batches, extras)
