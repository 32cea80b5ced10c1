"""Apply streams (``[target] apply_streams = N``, issue 26): the released, commit-ts-ordered changes of each
resolved window are split by target table into N transaction streams written in parallel, so that one driver
thread no longer bounds how fast a replica can apply. Each stream commits its rows with its own progress row in the
same transaction (``applier_streams``), no stream runs more than one window ahead of the others, a DDL is a barrier
across them, and the pipeline's applied ts is the minimum over the streams, moved by a marker transaction once every
stream committed a window (invariant 16): the replica as a whole stays consistent as of one resolved ts, and a
restart resumes each stream from its own progress (the gate's per-table floors). :mod:`.assign` decides which
stream a table's changes go to; :mod:`.apply` runs the streams as threads of the driver, :mod:`.remote` as Spark
tasks (``[target] apply_on``), both through :mod:`.store`.
"""
