"""The fake clouds' own bill: what each fake would charge, from its own record of every instance's life.

Each fake feeds a `FakeBill` from the state changes it makes itself (an instance created, started,
stopped, deleted: whoever asked, cloudtrain, the watchdog's stand-in or a test acting as the
console), with the clock of the moment it made them, and with the cloud's billing rules: compute
per start with the cloud's minimum (cost.billing_minimum_s), disks from creation to deletion.
Prices are the fake's price list: the catalog's price of the instance's type in its region and
market, the storage table's price per GB of its disks. A ledger test compares `cloudtrain cost
--json` with `bill.usd()`: the two must agree within 1%.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field


@dataclass
class _Life:
    instance_id: str
    cluster: str
    hourly: float  # compute, USD per hour
    disk_hourly: float  # the instance's disks, USD per hour
    min_s: float
    created: float
    runs: list[list[float | None]] = field(default_factory=list)  # [start, end or None]
    deleted: float | None = None

    def usd(self, until: float) -> float:
        compute = 0.0
        for start, end in self.runs:
            assert start is not None
            stop = end if end is not None else until
            compute += max(stop - start, self.min_s)
        disk_s = (self.deleted if self.deleted is not None else until) - self.created
        return (compute * self.hourly + max(0.0, disk_s) * self.disk_hourly) / 3600.0

    @property
    def running(self) -> bool:
        return bool(self.runs) and self.runs[-1][1] is None


class FakeBill:
    """The bill of one fake cloud, instance by instance. Thread-safe (fakes answer from threads)."""

    def __init__(self, cloud: str) -> None:
        self.cloud = cloud
        self._lives: dict[str, _Life] = {}
        self._lock = threading.Lock()

    def created(self, instance_id: str, cluster: str, hourly: float, disk_hourly: float,
                at: float | None = None, running: bool = True) -> None:
        from cloudtrain.cost import billing_minimum_s

        now = time.time() if at is None else at
        with self._lock:
            if instance_id in self._lives:
                return  # an idempotent create (the same client token) bills once
            life = _Life(instance_id, cluster, hourly, disk_hourly, billing_minimum_s(self.cloud), now)
            if running:
                life.runs.append([now, None])
            self._lives[instance_id] = life

    def started(self, instance_id: str, at: float | None = None) -> None:
        with self._lock:
            life = self._lives.get(instance_id)
            if life is not None and not life.running and life.deleted is None:
                life.runs.append([time.time() if at is None else at, None])

    def stopped(self, instance_id: str, at: float | None = None) -> None:
        with self._lock:
            life = self._lives.get(instance_id)
            if life is not None and life.running:
                life.runs[-1][1] = time.time() if at is None else at

    def deleted(self, instance_id: str, at: float | None = None) -> None:
        now = time.time() if at is None else at
        with self._lock:
            life = self._lives.get(instance_id)
            if life is None or life.deleted is not None:
                return
            if life.running:
                life.runs[-1][1] = now
            life.deleted = now

    def usd(self, cluster: str | None = None, until: float | None = None) -> float:
        """What the cloud bills for `cluster`'s instances (every instance: None) up to `until`."""
        end = time.time() if until is None else until
        with self._lock:
            return sum(life.usd(end) for life in self._lives.values() if cluster in (None, life.cluster))

    def running(self, cluster: str | None = None) -> list[str]:
        """Instances billing compute now."""
        with self._lock:
            return sorted(i for i, life in self._lives.items() if life.running and cluster in (None, life.cluster))

    def lifetimes(self, cluster: str | None = None) -> dict[str, float]:
        """Seconds each instance has run compute so far (every start, without the minimum)."""
        now = time.time()
        with self._lock:
            return {i: sum((end if end is not None else now) - start for start, end in life.runs)  # type: ignore[operator]
                    for i, life in self._lives.items() if cluster in (None, life.cluster)}

    def instances(self, cluster: str | None = None) -> list[str]:
        with self._lock:
            return sorted(i for i, life in self._lives.items() if cluster in (None, life.cluster))
