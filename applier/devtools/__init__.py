"""Tooling that ships with the applier but is never loaded by it: the demo, the benchmark, the changefeed
generators and test encoders, the replica checks, and the local-services launcher (Kafka, MariaDB, PostgreSQL,
a schema registry).

Why a package of its own: a deployed ``applier run`` loads only the stages it runs
(source -> decode -> route -> gate -> order -> apply -> report); ``tests/unit/test_layout.py`` checks that no
product module imports anything from here. Tooling may import the product, never the other way round.
"""
