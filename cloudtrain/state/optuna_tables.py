"""Optuna's tables in the team database (a sweep's study, sweep/space.py): which they are, making
them (the admin's `team init` / `team migrate`: members may not create tables) and opening Optuna's
RDBStorage on them over the state's own connection (state/pg.py `connect`: the URL, its password
file and timeouts mean what they mean for the state). The state owns what lives in its database;
the sweep decides when a study is opened there.
"""

from __future__ import annotations

from typing import Any

from cloudtrain.errors import UsageError


def study_tables() -> tuple[str, ...]:
    """The tables Optuna's RDBStorage keeps a study in (its models' and alembic's version table):
    what a team member is granted next to ours (state/team.py `grants`)."""
    from optuna.storages._rdb import models

    return (*sorted(models.BaseModel.metadata.tables), "alembic_version")


def create_study_tables(url: str) -> None:
    """Make Optuna's tables in the team database at `url` where they are missing (the admin's
    `team init`/`team migrate`: members may not create tables)."""
    storage = team_storage(url)
    storage.scoped_session.remove()
    storage.engine.dispose()


def team_storage(url: str) -> Any:
    """Optuna's RDBStorage on the team database: SQLAlchemy over the connection the state opens
    (state/pg.py `connect`, so the URL, its password file and timeouts mean exactly what they do
    for the state), in a transaction per Optuna operation as SQLAlchemy expects. Optuna creates
    its tables where they are missing and the role may (a no-op where they exist)."""
    import sqlalchemy.exc
    from optuna.exceptions import StorageInternalError
    from optuna.storages import RDBStorage

    from cloudtrain.state import pg

    def connect() -> Any:
        conn = pg.connect(url, rows=False)  # the driver's own connection and tuple rows, as SQLAlchemy expects
        conn.autocommit = False
        return conn

    where = pg.display(url)
    try:
        # pool_pre_ping: a connection the server dropped while trials ran is replaced, not an error.
        return RDBStorage("postgresql+psycopg2://", engine_kwargs={"creator": connect, "pool_pre_ping": True})
    except (sqlalchemy.exc.DBAPIError, StorageInternalError) as exc:
        import psycopg2
        import psycopg2.errors

        # Optuna wraps some of SQLAlchemy's errors, which wrap the driver's: the driver's says what happened.
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, psycopg2.Error):
            cause = getattr(cause, "orig", None) or cause.__cause__
        first = _first_line(cause or exc)
        if isinstance(cause, psycopg2.errors.InsufficientPrivilege):
            raise UsageError(f"the team database {where} keeps sweeps' Optuna studies, and this member may not use "
                             f"its Optuna tables ({first})",
                             hint="an admin runs `cloudtrain team migrate` (it creates them) and the grants "
                                  "`cloudtrain team init` prints") from None
        raise UsageError(f"the team database {where}: could not open the sweep's Optuna study ({first})") from None
    except RuntimeError as exc:
        # Optuna's own check: its tables were made by an Optuna whose schema differs from this one's.
        raise UsageError(f"the team database {where}: its Optuna tables do not match this Optuna ({_first_line(exc)})",
                         hint="an admin upgrades them (`optuna storage upgrade`), or install the Optuna the "
                              "team uses") from None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
