"""The runtime objects a configuration describes, shared by the driver (applier.pipeline) and the apply streams'
Spark tasks (applier.streams.remote): the target's engine, the router, and the keywords that decide how an
:class:`applier.apply.Applier` writes. Kept apart from applier.pipeline (Spark glue, the run loop) so that a task
builds its applier exactly as the driver does without importing the run loop.
"""

from __future__ import annotations

import logging
from typing import Any

from sqlalchemy.engine import Engine

from applier.config import ConfigError, Settings
from applier.dialect import target_engine
from applier.routing import Router

log = logging.getLogger("applier.wiring")


def router_for(settings: Settings) -> Router:
    """The ``[[route]]`` rules with ``[target] schema`` as the default (build it once: it caches per table)."""
    return Router(settings.routes, default_schema=settings.target.schema)


def applier_options(settings: Settings, router: Router) -> dict[str, Any]:
    """The :class:`applier.apply.Applier` keywords a configuration decides (also :class:`BatchProcessor`'s): one
    place for the driver's appliers and those the apply streams build in Spark tasks (applier.streams.remote), so
    both write the same way."""
    t = settings.target
    return dict(batch_rows=t.batch_rows, on_unsupported_ddl=t.on_unsupported_ddl, shard_ddl=t.shard_ddl,
                on_apply_error=t.on_apply_error, apply_error_policy=router.apply_error_policy,
                write_mode=router.write_mode, ddl_scope=router.routed_by_rule, schema_evolution=t.schema_evolution)


def make_engine(settings: Settings, *, load_data: bool = False) -> Engine:
    """The target's engine. ``load_data``: its MySQL/MariaDB connections may answer the server's request for the
    writer's own LOAD DATA file (:func:`applier.sinks.mysql_load.enable_local_infile`); only ``applier run``
    asks for it, when ``[target] load_data`` is not "off" (then :func:`settle_load_data`)."""
    engine = target_engine(settings.target, pool_pre_ping=True, pool_size=2, max_overflow=2)
    if load_data and settings.target.uses_load_data:
        from applier.sinks.mysql_load import enable_local_infile

        enable_local_infile(engine)
    return engine


def settle_load_data(engine: Engine, settings: Settings) -> Engine:
    """``[target] load_data`` at start, on an engine made with ``load_data=True``: asks the server once whether it
    allows ``LOAD DATA LOCAL`` (``@@GLOBAL.local_infile``). Allowed: the engine as it is (upserts of
    :data:`~applier.sinks.mysql_load.MIN_ROWS` rows or more go through it). Not allowed: "on" refuses to start,
    naming the server setting; "auto" says so once and returns an engine without local_infile (executemany, as
    with "off"), so a connection never offers the capability it will not use."""
    if not settings.target.uses_load_data:
        return engine
    from applier.sinks.mysql_load import MIN_ROWS, server_allows_local_infile

    with engine.connect() as conn:
        allowed = server_allows_local_infile(conn)
    if allowed:
        log.info("[target] load_data = \"%s\": upserts of %d rows or more go through LOAD DATA LOCAL INFILE",
                 settings.target.load_data, MIN_ROWS)
        return engine
    engine.dispose()
    if settings.target.load_data == "on":
        raise ConfigError(
            "target.load_data", '"on" needs LOAD DATA LOCAL INFILE, which the target server does not allow (its '
            "local_infile is OFF): run SET GLOBAL local_infile = 1 on it (and set local_infile = 1 under [mysqld] in "
            'its configuration, so that a restart keeps it), or set load_data = "auto" (executemany while the '
            'server does not allow it) or "off"')
    log.warning('[target] load_data = "auto": the target server does not allow LOAD DATA LOCAL INFILE (its '
                "local_infile is OFF), so upserts go through executemany; SET GLOBAL local_infile = 1 on the server "
                '(and local_infile = 1 under [mysqld]) enables the faster path at the next start, load_data = "off" '
                "silences this")
    return make_engine(settings)

