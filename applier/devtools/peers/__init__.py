"""Peers the benchmark races the applier against (``python -m applier.devtools.bench_peer``): other consumers of
the same TiCDC topic writing into the same kind of target. Tooling: the product never imports it.

* :mod:`applier.devtools.peers.debezium_jdbc`: the Debezium JDBC sink on Kafka Connect standalone, for TiCDC's
  Debezium protocol.
"""
