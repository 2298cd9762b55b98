"""A real PostgreSQL for the shared-state tests: a cluster of its own, in a temp directory.

Debian's server binaries (`postgresql` package: /usr/lib/postgresql/<v>/bin) run initdb and
pg_ctl; the server listens on a unix socket only (listen_addresses is empty: nothing on the
network), trusts local connections, and is stopped and deleted at the end of the session. As
root it runs as the `postgres` user (PostgreSQL refuses root). Without the binaries the tests that
need it are skipped, unless CI=1 (then they fail: CI must run the state suite on both engines).

Fixtures:
- postgres_server (session): the running server; `.url(db)`, `.create_database()`, `.drop_database()`
- state_backend: parametrized "sqlite" / "postgres"; for postgres, a fresh database at the current
  schema with CLOUDTRAIN_STATE_URL pointing at it, so `StateStore()` and the CLI use it
"""

from __future__ import annotations

import contextlib
import getpass
import os
import secrets
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.state.location import ENV


def server_binaries() -> Path | None:
    """The newest installed PostgreSQL server's bin directory, or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb else None


class PostgresServer:
    def __init__(self, bindir: Path) -> None:
        self.bindir = bindir
        self.root = Path(tempfile.mkdtemp(prefix="ct-pg-"))
        self.data = self.root / "data"
        self.socket_dir = self.root / "sock"
        self.socket_dir.mkdir()
        self.log = self.root / "server.log"
        self._as: list[str] = []
        self.superuser = getpass.getuser()
        if os.geteuid() == 0:
            # PostgreSQL will not run as root: its own user owns the cluster's files.
            self._as = ["runuser", "-u", "postgres", "--"]
            self.superuser = "postgres"
            shutil.chown(self.root, "postgres")
            shutil.chown(self.socket_dir, "postgres")
        self._template: str | None = None

    def _run(self, *args: str) -> None:
        done = subprocess.run([*self._as, *args], capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            log = self.log.read_text()[-2000:] if self.log.exists() else ""
            raise RuntimeError(f"{' '.join(args[:2])} failed ({done.returncode}): {done.stderr.strip()}\n{log}")

    def start(self) -> None:
        self._run(str(self.bindir / "initdb"), "-D", str(self.data), "-U", self.superuser, "-A", "trust",
                  "-E", "UTF8", "--locale=C", "--no-sync", "--no-instructions")
        # Durability is not under test: no fsync keeps a database per test cheap.
        options = (f"-c listen_addresses='' -c unix_socket_directories={self.socket_dir} -c fsync=off "
                   "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", options, "-w",
                  "-t", "60", "start")

    def stop(self) -> None:
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def url(self, database: str = "postgres", user: str | None = None) -> str:
        return f"postgresql:///{database}?host={self.socket_dir}&user={user or self.superuser}"

    def sql(self, statement: str, database: str = "postgres") -> None:
        with connection(self.url(database)) as conn:
            conn.execute(statement)

    def create_database(self, template: str | None = None) -> str:
        name = "ct_" + secrets.token_hex(6)
        self.sql(f"CREATE DATABASE {name}" + (f" TEMPLATE {template}" if template else ""))
        return name

    def drop_database(self, name: str) -> None:
        self.sql(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def grant_members(self, database: str) -> None:
        """Run the grants `team init` prints on `database` (as its admin would), so that roles in
        cloudtrain_member can use it. The role itself is cluster-wide: another test may have made it."""
        import psycopg2.errors

        from cloudtrain.state.team import grants

        for statement in grants(self.url(database)).splitlines():
            if statement.startswith("--"):
                continue
            try:
                self.sql(statement, database)
            except psycopg2.errors.DuplicateObject:
                continue

    def initialized_database(self) -> str:
        """A new database at the current schema (copied from one `team init` prepared once)."""
        if self._template is None:
            from cloudtrain.state.team import migrate

            self._template = self.create_database()
            migrate(self.url(self._template), init=True)
        return self.create_database(template=self._template)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A real PostgreSQL server for this test session: its own cluster in a temp directory, on a
    unix socket only (run as `postgres` when the tests run as root), stopped at the session's end."""
    bindir = server_binaries()
    if bindir is None:
        message = "PostgreSQL server binaries not installed (apt-get install postgresql; scripts/setup.sh --test)"
        if os.environ.get("CI") == "1":
            pytest.fail(message)
        pytest.skip(message)
    server = PostgresServer(bindir)
    try:
        server.start()
        yield server
    finally:
        server.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def state_backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """Run the test once on this machine's SQLite file and once on a fresh PostgreSQL database."""
    if request.param == "sqlite":
        monkeypatch.delenv(ENV, raising=False)
        yield "sqlite"
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    database = server.initialized_database()
    monkeypatch.setenv(ENV, server.url(database))
    try:
        yield "postgres"
    finally:
        server.drop_database(database)


@contextlib.contextmanager
def connection(url: str) -> Iterator[Any]:
    """An admin's autocommit connection, as psql gives one (`conn.execute(sql, params)` answers
    its cursor), closed on leaving. The driver's own, not the state's: no keepalives, no checks."""
    import psycopg2

    from cloudtrain.state.pg import Raw

    conn = psycopg2.connect(url)
    conn.autocommit = True
    try:
        yield Raw(conn)
    finally:
        conn.close()
