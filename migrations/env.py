"""Alembic environment for the applier's own tables, run from code (see applier/migrate.py).

The connection comes in through ``config.attributes["connection"]``; the version table has the applier's own
name so that it never collides with a downstream application's ``alembic_version``.
"""

from alembic import context

from applier.progress import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, version_table=VERSION_TABLE, transactional_ddl=None)
with context.begin_transaction():
    context.run_migrations()
