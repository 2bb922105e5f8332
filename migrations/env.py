"""Alembic environment: the URL comes from the Alembic config when set (tests, `upgrade_database`),
else from the project's settings (`DATABASE_URL`, default `sqlite:///var/arag.db`)."""

from logging.config import fileConfig

from alembic import context

from adaptive_rag.storage.db import make_engine, normalise_url
from adaptive_rag.storage.models import Base

config = context.config
if config.config_file_name is not None:
    fileConfig(config.config_file_name)

target_metadata = Base.metadata


def database_url() -> str:
    url = config.get_main_option("sqlalchemy.url")
    if url:
        return normalise_url(url)
    from adaptive_rag.settings import Settings

    return normalise_url(Settings().database_url)


def run_migrations_offline() -> None:
    """Emit SQL to stdout (`alembic upgrade head --sql`)."""
    context.configure(
        url=database_url(), target_metadata=target_metadata, literal_binds=True,
        dialect_opts={"paramstyle": "named"}, render_as_batch=True,
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    engine = make_engine(database_url())
    with engine.connect() as connection:
        if connection.dialect.name == "sqlite":
            # Batch mode drops the old table after copying it; with foreign keys enforced, SQLite
            # empties a dropped table first and its ON DELETE CASCADE empties every table that
            # references it (a `requests` change would delete all results and decisions). The
            # pragma is ignored inside a transaction, so it is set before the migrations begin.
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        # Batch mode lets later ALTERs work on SQLite too (copy-and-move of the table).
        context.configure(
            connection=connection, target_metadata=target_metadata, render_as_batch=True
        )
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
