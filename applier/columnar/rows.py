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
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import pyarrow as pa

from applier.columnar import values as V
from applier.events import Column, Event, Op, RowChange, SourcePosition

META = ("_ts", "_part", "_off", "_size")
META_TYPES = (pa.int64(), pa.int32(), pa.int64(), pa.int64())


@dataclass(frozen=True)
class Shape:
    """What every row change of a :class:`RowBatch` shares."""

    schema: str
    table: str
    op: Op
    columns: tuple[Column, ...]
    topic: str
    before_keys: tuple[str, ...] | None
    after_keys: tuple[str, ...] | None
    kinds: tuple[str, ...]  # per image column, in key order (both images share names and kinds)


@dataclass
class RowBatch:
    shape: Shape
    data: pa.RecordBatch

    def __len__(self) -> int:
        return self.data.num_rows

    def to_events(self, converters: Sequence[Callable[[Any], Any]] | None = None) -> list[RowChange]:
        """The row changes, as the codec's per-record decoder gives them. ``converters`` (per image column, in
        key order) turn the text kinds (decimal) into their values; without them a decimal is ``Decimal(text)``,
        which is what :func:`applier.mysql_values.parse_decimal` gives."""
        sh, d = self.shape, self.data
        n = d.num_rows
        ts, parts, offs, sizes = (d.column(c).to_pylist() for c in META)
        images = []
        for prefix, keys in (("b:", sh.before_keys), ("a:", sh.after_keys)):
            if keys is None:
                images.append(itertools.repeat(None, n))
                continue
            cols = [V.to_python(k, None, d.column(prefix + name)) for name, k in zip(keys, sh.kinds)]
            if not keys:
                images.append([{} for _ in range(n)])
            else:
                images.append(list(map(dict, map(zip, itertools.repeat(keys), zip(*cols)))))
        positions = map(SourcePosition, itertools.repeat(sh.topic), parts, offs)
        return list(map(RowChange, itertools.repeat(sh.schema), itertools.repeat(sh.table), ts,
                        itertools.repeat(sh.op), images[0], images[1], itertools.repeat(sh.columns), positions,
                        sizes))


def build_batch(shape: Shape, ts: Any, parts: Any, offs: Any, sizes: Any,
                before: Sequence[pa.Array] | None, after: Sequence[pa.Array] | None) -> RowBatch:
    """A RowBatch from its columns: the positions as lists or Arrow arrays, the image arrays in key order."""
    arrays = [v if isinstance(v, pa.Array) else pa.array(v, t) for v, t in zip((ts, parts, offs, sizes), META_TYPES)]
    names = list(META)
    for prefix, keys, cols in (("b:", shape.before_keys, before), ("a:", shape.after_keys, after)):
        if keys is None:
            continue
        assert cols is not None and len(cols) == len(keys)
        arrays.extend(cols)
        names.extend(prefix + k for k in keys)
    return RowBatch(shape, pa.RecordBatch.from_arrays(arrays, names=names))


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
