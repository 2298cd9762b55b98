"""One connection per CLI process on a team database (issue 37; state/pg.py, state/locks.py): every
store a process opens on the database and its cluster locks share one session, and its threads
take turns on it without stepping on each other: a transaction is never entered by another
thread's statement, two threads of one process are kept apart by a cluster lock (the session's
advisory locks alone are re-entrant), and a lock is given back when its holder fails."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest

from cloudtrain.state import StateStore
from cloudtrain.state.locks import cluster_lock
from cloudtrain.testing.postgres import PostgresServer


@pytest.fixture
def team(postgres_server: PostgresServer, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A fresh team database at the current schema, as the state for this test."""
    database = postgres_server.initialized_database()
    monkeypatch.setenv("CLOUDTRAIN_STATE_URL", postgres_server.url(database))
    try:
        yield
    finally:
        postgres_server.drop_database(database)


def _backends(store: StateStore) -> int:
    return store._db.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'cloudtrain' "
                             "AND datname = current_database()").fetchone()[0]


def test_every_store_and_lock_of_a_process_is_one_session(team: None) -> None:
    stores = [StateStore() for _ in range(3)]
    pids = {s._db.execute("SELECT pg_backend_pid()").fetchone()[0] for s in stores}
    with cluster_lock("c1"), cluster_lock("c2"):
        assert len(pids) == 1 and _backends(stores[0]) == 1
    for store in stores[:2]:
        store.close()
    assert stores[2].get_cluster("nothing") is None  # the last user keeps it open
    stores[2].close()
    again = StateStore()
    assert again._db.execute("SELECT pg_backend_pid()").fetchone()[0] not in pids  # closed by the last one out
    again.close()


def test_a_transaction_is_never_entered_by_another_threads_statement(team: None) -> None:
    store = StateStore()
    other = StateStore()
    inside, wrote = threading.Event(), threading.Event()

    def write_meanwhile() -> None:
        inside.wait(10)
        other.upsert_cluster(name="theirs", provider="aws", status="up", owner="b")
        wrote.set()

    thread = threading.Thread(target=write_meanwhile)
    thread.start()
    with pytest.raises(RuntimeError), store._write() as db:
        db.execute("INSERT INTO events (ts, cluster, kind, message) VALUES (?, ?, ?, ?)", (time.time(), "x", "k", "m"))
        inside.set()
        # The other thread's write waits for this transaction to end; it never lands in it.
        assert not wrote.wait(0.5)
        raise RuntimeError("rolled back")
    thread.join(10)
    assert wrote.is_set()
    assert store.list_events("x") == []  # this transaction's row went with the rollback
    assert store.get_cluster("theirs") is not None  # the other thread's did not
    store.close()
    other.close()


def test_two_threads_of_one_process_take_turns_on_a_cluster_lock(team: None) -> None:
    holding: list[str] = []
    overlaps: list[str] = []

    def hold(who: str) -> None:
        with cluster_lock("shared"):
            if holding:
                overlaps.append(f"{who} while {holding[0]}")
            holding.append(who)
            time.sleep(0.2)
            holding.remove(who)

    threads = [threading.Thread(target=hold, args=(f"t{i}",)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert overlaps == []


def test_a_lock_is_given_back_when_its_holder_fails(team: None) -> None:
    store = StateStore()
    with pytest.raises(ValueError), cluster_lock("c"):
        raise ValueError("the command failed")
    held = store._db.execute("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 "
                             "AND pid = pg_backend_pid()").fetchone()[0]
    assert held == 0
    store.close()


def test_the_session_asks_the_server_to_probe_it(team: None) -> None:
    """A laptop that sleeps holding a cluster's or a sweep's lock loses it within minutes, not the
    server OS's two hours: every CLI session sets the server's TCP keepalives (state/pg.py)."""
    from cloudtrain.state.pg import KEEPALIVES

    store = StateStore()
    rows = store._db.execute("SELECT name, source, reset_val FROM pg_settings WHERE name LIKE 'tcp_keepalives_%' "
                             "ORDER BY name").fetchall()
    assert {row[0]: row[1] for row in rows} == {f"tcp_keepalives_{k}": "session" for k in KEEPALIVES}
    # (On this kit's Unix socket the server reads them as zero; over TCP they are the values set.)
    assert store._db.execute("SELECT current_setting('application_name')").fetchone()[0] == "cloudtrain"
    store.close()
