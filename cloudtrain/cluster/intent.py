"""Launch intents: while a cluster is being created its row names the process creating it
(procid: boot id, pid, start time) and carries a heartbeat, so that `gc`, `cost` and `down` in
other terminals see a launch in flight rather than a leak (ClusterRecord.launch_in_flight)."""

from __future__ import annotations

from cloudtrain.state import ClusterStatus, StateStore


class Heartbeat:
    """While a launch is in flight its row's heartbeat is fresh (other terminals and `gc` leave it
    alone). Its own connection: SQLite connections are not shared across threads mid-transaction."""

    def __init__(self, path: object, name: str, every_s: float = 10.0) -> None:
        import threading

        self._path, self._name, self._every = path, name, every_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        import threading

        if self._thread is None:
            self._thread = threading.Thread(target=self._beat, name="launch-heartbeat", daemon=True)
            self._thread.start()

    def _beat(self) -> None:
        import logging

        store = StateStore(self._path)  # type: ignore[arg-type]
        try:
            while not self._stop.wait(self._every):
                record = store.get_cluster(self._name)
                if record is None or record.uid is None or record.status != ClusterStatus.PROVISIONING:
                    return
                try:
                    store.heartbeat(self._name, record.uid)
                except store.errors as exc:  # a busy or unreachable database: the next beat tries again
                    logging.getLogger(__name__).debug("heartbeat of %s: %s", self._name, exc)
        finally:
            store.close()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def is_me(driver: str) -> bool:
    from cloudtrain import procid

    return driver == procid.identity()
