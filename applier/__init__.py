"""TiCDC downstream replication applier: Kafka -> Spark -> MySQL/MariaDB/PostgreSQL."""

__version__ = "0.1.0"
