"""The ``--upstream`` option: its URL (with the password from ``--upstream-password-env``) and the connection.

Why a module of its own: the option's errors name the option and never echo a password, and an unreachable
upstream is its own exit code (5).
"""

from __future__ import annotations

from typing import Any, Mapping

from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError

from applier.verify.snapshot import error_line

UPSTREAM_EXAMPLE = "--upstream mysql+pymysql://user@tidb-host:4000/"
UPSTREAM_DRIVERS = {"mysql": "mysql+pymysql", "mysql+pymysql": "mysql+pymysql", "mariadb": "mariadb+pymysql",
                    "mariadb+pymysql": "mariadb+pymysql", "tidb": "mysql+pymysql"}


class UpstreamUnreachable(Exception):
    """The upstream server cannot be reached or refused the login (exit code 5); the message names the host
    and never the password."""


def upstream_url(raw: str, *, password_env: str | None = None, env: Mapping[str, str] | None = None) -> Any:
    """Parse ``--upstream`` (and take the password from ``--upstream-password-env``); a malformed value raises
    ConfigError naming the option, without echoing a password."""
    import os

    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from applier.config import ConfigError

    env = os.environ if env is None else env
    try:
        url = make_url(raw)
    except (ArgumentError, ValueError):
        raise ConfigError("--upstream", f"not a valid database URL; write e.g. {UPSTREAM_EXAMPLE}",
                          source="command line") from None
    driver = UPSTREAM_DRIVERS.get(url.drivername)
    if driver is None:
        raise ConfigError("--upstream", f"unsupported driver {url.drivername!r}: the upstream is TiDB or MySQL, "
                          f"e.g. {UPSTREAM_EXAMPLE}", source="command line")
    if not url.host:
        raise ConfigError("--upstream", f"missing host; write e.g. {UPSTREAM_EXAMPLE}", source="command line")
    url = url.set(drivername=driver)
    if password_env:
        if url.password is not None:
            raise ConfigError("--upstream-password-env", "the --upstream URL already carries a password; set it in "
                              "one place", source="command line")
        if not env.get(password_env):
            raise ConfigError("--upstream-password-env", f"environment variable {password_env} is not set or empty",
                              source="command line")
        url = url.set(password=env[password_env])
    return url


def connect_upstream(url: Any, timeout: int = 10) -> Engine:
    """An engine on the upstream (no pool: the run holds one connection; autocommit, so TiDB reads each
    statement at ``tidb_snapshot`` and MySQL's START TRANSACTION opens the one snapshot), tried once."""
    from sqlalchemy import create_engine
    from sqlalchemy.pool import NullPool

    engine = create_engine(url, poolclass=NullPool, isolation_level="AUTOCOMMIT",
                           connect_args={"connect_timeout": timeout})
    try:
        with engine.connect():
            pass
    except DBAPIError as exc:
        engine.dispose()
        reason = error_line(exc)
        if url.password:
            reason = reason.replace(str(url.password), "***")
        raise UpstreamUnreachable(
            f"cannot connect to the upstream {url.render_as_string(hide_password=True)}: {reason}. Check --upstream "
            "(host, port, user; a password through --upstream-password-env) and that the server is reachable "
            "from this host") from None
    return engine
