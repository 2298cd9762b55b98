"""StateStore's PostgreSQL backend: a connection that takes StateStore's SQL as SQLite reads it.

Why an adapter and not a second store class: StateStore's ~40 queries are plain SQL that both
engines read alike except for a handful of spellings, so one copy of every query (and of the
notify outbox's) stays the contract, and a query added later runs on both without being written
twice. The differences, all translated here in one place:

- placeholders: `?` and `:name` become the driver's `%s` and `%(name)s` (a literal `%` is doubled);
- SQLite's two-argument scalar `MAX(a, b)` is PostgreSQL's `GREATEST(a, b)`;
- a Python bool is bound as 0/1, as SQLite stores it (the columns are INTEGER on both);
- rows answer `row["name"]` and `row[0]`, like sqlite3.Row.

Transactions keep SQLite's model: the connection autocommits single statements (readers never
wait), and a write transaction (`StateStore._write`) takes one transaction-level advisory lock
first, so writers run one at a time across every CLI of the team exactly as `BEGIN IMMEDIATE`
makes them do on one file: a read-then-write in a transaction can never interleave with another.
Writes are milliseconds long; 50 CLIs queue for a few milliseconds each, never deadlock.

The driver is psycopg2 (its binary wheel carries libpq): it imports in ~40 ms where psycopg 3,
which loads asyncio and importlib.metadata at import, takes 200-500 ms, and every verb on a team
database pays that import (docs/teams.md, "Speed").

One connection per CLI process: every store a process opens on the same database (the command's,
a launch heartbeat's thread, a liveness marker's, a recovery's) and its cluster locks
(state/locks.py) share one session, so 50 CLIs hold at most 50 connections. Its threads take
turns on it: a write transaction holds the session from BEGIN to COMMIT or ROLLBACK (a statement
of another thread waits, never lands inside it), a single statement holds it for that statement.
"""

from __future__ import annotations

import os
import re
import threading
import weakref
from collections.abc import Iterator, Mapping, Sequence
from functools import lru_cache
from typing import Any

from cloudtrain.errors import CloudtrainError, UsageError

# Advisory lock keys (bigint, per database): every write transaction, and `team migrate`.
WRITE_LOCK = 0x63740001
MIGRATE_LOCK = 0x63740002
BEGIN = "BEGIN"
AFTER_BEGIN = f"SELECT pg_advisory_xact_lock({WRITE_LOCK})"
VERSION_TABLE = "cloudtrain_schema"
CONNECT_TIMEOUT_S = 10

_MAX2 = re.compile(r"\bMAX\(([^(),]+),([^(),]+)\)", re.IGNORECASE)


@lru_cache(maxsize=512)
def translate(sql: str, with_params: bool) -> str:
    """SQLite-flavoured SQL as the driver takes it (see the module's docstring)."""
    sql = _MAX2.sub(r"GREATEST(\1,\2)", sql)
    out: list[str] = []
    quote: str | None = None
    i = 0
    while i < len(sql):
        ch = sql[i]
        if quote:
            out.append("%%" if ch == "%" and with_params else ch)
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
            out.append(ch)
        elif ch == "?":
            out.append("%s")
        elif ch == ":" and sql[i + 1:i + 2] == ":":  # a cast, `x::text`
            out.append("::")
            i += 1
        elif ch == ":" and re.match(r"[A-Za-z_]", sql[i + 1:i + 2]):
            name = re.match(r"\w+", sql[i + 1:])
            assert name is not None
            out.append(f"%({name.group(0)})s")
            i += len(name.group(0))
        elif ch == "%" and with_params:
            out.append("%%")
        else:
            out.append(ch)
        i += 1
    return "".join(out)


def _bind(value: Any) -> Any:
    return int(value) if isinstance(value, bool) else value


class Row:
    """One result row, read by column name or position (what sqlite3.Row offers)."""

    __slots__ = ("_names", "_values")

    def __init__(self, names: Mapping[str, int], values: Sequence[Any]) -> None:
        self._names, self._values = names, values

    def __getitem__(self, key: str | int) -> Any:
        return self._values[self._names[key]] if isinstance(key, str) else self._values[key]

    def __iter__(self) -> Iterator[Any]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[str]:
        return list(self._names)


@lru_cache(maxsize=1)  # asked once per statement: the import lookup once per process
def _driver() -> Any:
    try:
        import psycopg2
        import psycopg2.extensions
    except ImportError:
        raise UsageError("state_url is a PostgreSQL database, and its driver (psycopg2) is not installed",
                         hint="pip install 'cloudtrain[team]'") from None
    return psycopg2


@lru_cache(maxsize=1)
def _row_cursor() -> type:
    """A psycopg2 cursor whose rows are `Row`s (defined on first use: the driver loads lazily)."""
    base = _driver().extensions.cursor

    class RowCursor(base):  # type: ignore[misc, valid-type]
        def _names(self) -> dict[str, int]:
            return {column.name: i for i, column in enumerate(self.description or ())}

        def fetchone(self) -> Row | None:
            values = super().fetchone()
            return None if values is None else Row(self._names(), values)

        def fetchall(self) -> list[Row]:
            names = self._names()
            return [Row(names, values) for values in super().fetchall()]

        def fetchall_values(self) -> list[tuple[Any, ...]]:
            """The rows as the driver's tuples, for a reader that picks columns by position itself
            (state._rows: a Row's __getitem__ per field was half of reading 1,000 clusters)."""
            return list(super().fetchall())

        def fetchmany(self, size: int | None = None) -> list[Row]:
            names = self._names()
            rows = super().fetchmany(size) if size is not None else super().fetchmany()
            return [Row(names, values) for values in rows]

        def __iter__(self) -> Iterator[Row]:
            return iter(self.fetchall())

    return RowCursor


class Raw:
    """A driver connection that answers `execute(sql, params)` with its cursor, as sqlite3's does
    (StateStore, team migrations and the lock queries all call it so)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
        cursor = self.conn.cursor()
        cursor.execute(sql, params)
        return cursor

    @property
    def closed(self) -> bool:
        return bool(self.conn.closed)  # psycopg2: 1 closed, 2 broken

    def close(self) -> None:
        self.conn.close()


class StateUnavailable(CloudtrainError):
    """The team database went away during a command (server down, network, connection killed)."""


class _Session:
    """This process's one connection to a database, and whose turn it is on it (see the module's
    docstring). `turn` is re-entrant: a thread's statements inside its own transaction go on."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.turn = threading.RLock()
        self.users = 0

    def usable(self) -> bool:
        return not self.conn.closed


# (pid, url, project) -> the session. Weak: a store dropped without close() frees its connection
# as before (the driver closes it when collected). The pid: a forked child never shares a socket.
_sessions: weakref.WeakValueDictionary[tuple[int, str, str], _Session] = weakref.WeakValueDictionary()
_sessions_lock = threading.Lock()
_TRANSACTION = {"BEGIN": "begin", "COMMIT": "end", "ROLLBACK": "end"}


class PgConnection:
    """What StateStore and the outbox call on `_db`: execute (translated), close."""

    def __init__(self, session: _Session, url: str) -> None:
        self._session, self._url = session, url
        self._closed = False
        session.users += 1

    @property
    def _conn(self) -> Any:
        return self._session.conn

    def execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
        turn = self._session.turn
        step = _TRANSACTION.get(sql.strip().upper())
        if step == "begin":
            turn.acquire()  # held until this thread's COMMIT or ROLLBACK
            try:
                return self._execute(sql, params)
            except BaseException:
                turn.release()
                raise
        if step == "end":
            try:
                return self._execute(sql, params)
            finally:
                turn.release()  # even when the connection was lost: never a turn held for good
        with turn:
            return self._execute(sql, params)

    def _execute(self, sql: str, params: Sequence[Any] | Mapping[str, Any] | None) -> Any:
        driver = _driver()
        if not params:
            query, bound = translate(sql, False), None
        elif isinstance(params, Mapping):
            query, bound = translate(sql, True), {k: _bind(v) for k, v in params.items()}
        else:
            query, bound = translate(sql, True), [_bind(v) for v in params]
        try:
            return self._conn.execute(query, bound)
        except (driver.OperationalError, driver.InterfaceError) as exc:
            # One line, not a driver traceback: what the user can act on is that the database is away.
            # (InterfaceError: the driver had already seen the connection close.)
            raise StateUnavailable(f"lost the state database {display(self._url)}: {_first_line(exc)}",
                                   hint="run the command again once it is back; the nodes' jobs, watchdogs and "
                                        "deadlines do not need it, and `gc` finds by tag what a launch left") from exc

    def close(self) -> None:
        """This store is done with the session; the last one out closes the connection."""
        if self._closed:
            return
        self._closed = True
        with _sessions_lock:
            self._session.users -= 1
            if self._session.users > 0:
                return
            for key, session in list(_sessions.items()):
                if session is self._session:
                    del _sessions[key]
        self._session.conn.close()


def connect(url: str, *, rows: bool = True) -> Any:
    """A connection in autocommit mode (`Raw`; with rows=False the bare driver connection, for
    SQLAlchemy). libpq reads the URL, so sslmode, passfile (~/.pgpass, PGPASSFILE), service files
    (PGSERVICEFILE, `service=`) and PG* variables apply."""
    driver = _driver()
    try:
        given = driver.extensions.parse_dsn(url)
    except driver.ProgrammingError as exc:
        raise UsageError(f"state_url {url!r}: not a libpq URL ({_first_line(exc)})",
                         hint="e.g. postgresql://alice@db.example.com/cloudtrain?sslmode=require") from None
    extra: dict[str, Any] = {}
    # A database that does not answer must not hang a CLI; a timeout the user set (URL, service
    # file, PGCONNECT_TIMEOUT) wins.
    if not ({"connect_timeout", "service"} & set(given)) and "PGCONNECT_TIMEOUT" not in os.environ \
            and "PGSERVICE" not in os.environ:
        extra["connect_timeout"] = CONNECT_TIMEOUT_S
    if "application_name" not in given:
        extra["application_name"] = "cloudtrain"
    # A server gone quiet (a dropped link) must not hang this CLI for the OS's two hours either.
    for key, value in KEEPALIVES.items():
        if f"keepalives_{key}" not in given:
            extra[f"keepalives_{key}"] = value
    try:
        conn = driver.connect(url, cursor_factory=_row_cursor() if rows else None, **extra)
        conn.autocommit = True
    except driver.Error as exc:
        raise CloudtrainError(f"could not reach the state database {display(url)}: {_first_line(exc)}",
                              hint="check state_url / CLOUDTRAIN_STATE_URL and that the server is up") from None
    raw = Raw(conn)
    if "tcp_keepalives" not in given.get("options", "") + os.environ.get("PGOPTIONS", ""):
        _server_keepalives(raw, driver.Error)
    return raw if rows else conn


# TCP keepalive probes, both ways: after IDLE s of silence, every INTERVAL s, COUNT unanswered ones
# end the connection (about 2 minutes in all).
KEEPALIVES = {"idle": 60, "interval": 10, "count": 6}


def _server_keepalives(conn: Any, error: type[BaseException]) -> None:
    """Ask the server to probe this session too. A laptop that went to sleep (or off the network)
    holding a cluster's or a sweep's session lock would otherwise keep it until the server's OS
    gives up on the connection, two hours by default, and its teammates' `down` or `sweep resume`
    would wait that long; with these the server ends the session, and frees its locks, within
    about two minutes. Ignored on a Unix socket. A server or pooler that refuses the settings
    keeps its own: said at --debug, never a failed command."""
    settings = ", ".join(f"set_config('tcp_keepalives_{key}', '{value}', false)" for key, value in KEEPALIVES.items())
    try:
        conn.execute(f"SELECT {settings}")
    except error as exc:
        import logging

        logging.getLogger(__name__).debug("the server's keepalives stay its own: %s", _first_line(exc))


def errors() -> tuple[type[BaseException], ...]:
    return (_driver().Error, StateUnavailable)


def schema_version(conn: Any) -> int | None:
    """The version the database is at; None where it has no cloudtrain schema."""
    exists = conn.execute("SELECT to_regclass(%s) IS NOT NULL", (VERSION_TABLE,)).fetchone()[0]
    if not exists:
        return None
    return int(conn.execute(f"SELECT COALESCE(MAX(version), 0) FROM {VERSION_TABLE}").fetchone()[0])


def check_version(conn: Any, url: str) -> None:
    """A CLI uses only a database at its own schema version; it never migrates one on open (a
    shared database is migrated by an admin, `cloudtrain team migrate`)."""
    from cloudtrain.state.schema_pg import PG_SCHEMA_VERSION

    version = schema_version(conn)
    where = display(url)
    if version is None:
        raise UsageError(f"the state database {where} has no cloudtrain schema yet",
                         hint="an admin runs `cloudtrain team init` once (docs/teams.md)")
    if version < PG_SCHEMA_VERSION:
        raise UsageError(f"the state database {where} is at schema v{version}, older than this cloudtrain "
                         f"(v{PG_SCHEMA_VERSION})", hint="an admin runs `cloudtrain team migrate`")
    if version > PG_SCHEMA_VERSION:
        raise UsageError(f"the state database {where} is at schema v{version}, newer than this cloudtrain "
                         f"(v{PG_SCHEMA_VERSION})", hint="upgrade cloudtrain: pip install -U 'cloudtrain[team]'")


def open_store(url: str) -> PgConnection:
    """A store's connection: this process's session on `url` (opened, version-checked and given
    the config's project the first time; a lost one is replaced)."""
    from cloudtrain.state.location import project

    key = (os.getpid(), url, project())
    with _sessions_lock:
        session = _sessions.get(key)
        if session is None or not session.usable():
            session = _Session(_open_checked(url, key[2]))
            _sessions[key] = session
        return PgConnection(session, url)


def _open_checked(url: str, proj: str) -> Any:
    conn = connect(url)
    try:
        check_version(conn, url)
        # What every row this connection writes records as its project (schema v2's defaults).
        conn.execute("SELECT set_config('cloudtrain.project', %s, false)", (proj,))
    except BaseException:
        conn.close()
        raise
    return conn


def display(url: str) -> str:
    """The URL as messages show it: never a password (location.check refuses one, but a message
    must not depend on that)."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if parts.password is None:
        return url
    host = parts.hostname or ""
    netloc = f"{parts.username or ''}@{host}" + (f":{parts.port}" if parts.port else "")
    return urlunsplit(parts._replace(netloc=netloc))


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
