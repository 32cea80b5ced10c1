"""The columnar lane (issue 25): row changes kept as Arrow arrays from the Kafka record to the target.

Why: per-event Python costs 50-60 us of CPU per row change on top of what Spark, Kafka and the target cost
(docs/benchmarks.md, round 5); every step of that path was tuned per event in rounds 2-4. Measured step by step
(``applier.devtools.bench_columnar``), the same work on Arrow arrays costs a quarter to a tenth. This package
holds what that lane shares:

* :mod:`.rows` - the contract: :class:`~.rows.RowBatch` (the row changes of one shape as one Arrow record batch)
  and :class:`~.rows.ArrowSlice` (a decoded slice of Kafka records: batches, plus the events kept as objects in
  their place), and the way back to events for every stage that stays per event;
* :mod:`.values` - text of MySQL types to Arrow arrays, each conversion giving exactly what the codec's
  per-value converter gives, or refusing (then the slice is decoded record by record);
* :mod:`.json_values` - the same for JSON-typed values (numbers, booleans, epoch days and times: Debezium);
* :mod:`.held` - where the gate holds row batches (cut at the released ts, restart offsets, spill as Arrow IPC),
  and the copies a release drops;
* :mod:`.plan` - ``plan_batch`` on Arrow arrays (deletes, then each key's last version);
* :mod:`.apply` - when a window goes the columnar way, DDL segments, and the way back to events.

The lane's stages: decode in the workers (a codec's ``decode_arrow``: Canal-JSON, Open Protocol, Debezium), the gate
(:meth:`applier.gate.Gate.add_batches`), the per-key plan, then today's writers with the rows left after the collapse
(:func:`.plan.to_batch_plan`). Where a stage does not take a batch (a DDL inside the window, a keyless table, a
quarantined key, a mode), the batch becomes events (:meth:`~.rows.RowBatch.to_events`) for today's path.
"""
