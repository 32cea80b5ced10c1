"""Test encoders: producers of the Kafka records TiCDC writes, one module per protocol.

Test fixtures for the unit and end-to-end tests, the changefeed generators (:mod:`applier.devtools.changefeed`)
and the benchmark. The applier only decodes (:mod:`applier.codecs`) and never imports these.

* :mod:`.open` - Open Protocol (``encode_open``, ``encode_open_batch``)
* :mod:`.canal_json` - Canal-JSON (``encode_canal_json``)
* :mod:`.simple` - Simple, JSON and Avro (``encode_simple``, ``encode_bootstrap``)
* :mod:`.debezium` - Debezium JSON (``encode_debezium``)
* :mod:`.avro` - flat Avro with a schema registry (``AvroEncoder``)
* :mod:`.registry` - an in-memory schema registry (``InMemoryRegistry``)
* :mod:`.values` - the value formatters the encoders share
"""
