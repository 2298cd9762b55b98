"""What recovery (recover.py, recover_upload.py) reads and writes of the run it recovers and of the
executor that runs it, as Protocols: pipeline's `_Run` and `Executor` are them as they are, and the
recovery modules sit below pipeline.py instead of naming its private record (no import circle,
tests/test_architecture.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from cloudtrain.cluster.lifecycle import Cluster, Lifecycle
    from cloudtrain.cluster.nodes import Node
    from cloudtrain.cluster.planning import UsablePlan
    from cloudtrain.config import Config
    from cloudtrain.events import Reporter
    from cloudtrain.recipe import LoadedRecipe
    from cloudtrain.run.collect import Collected
    from cloudtrain.run.recover_watch import Watcher
    from cloudtrain.run.stop import StopToken
    from cloudtrain.state import RunRecord, StateStore


class PhaseClock(Protocol):
    reporter: Reporter
    spent: Callable[[], float | None]  # the run's spend so far, on every phase line
    stop: StopToken | None  # the current attempt's, checked between phases (run/stop.py)


class RunSoFar(Protocol):
    """What one run has done so far (pipeline._Run): a relaunch resets its cluster and nodes."""

    run_id: str
    run_dir: Path
    loaded: LoadedRecipe
    clock: PhaseClock
    started: float
    cluster: Cluster | None
    created: bool
    nodes: list[Node]
    jobs_started: list[str]
    status: str
    collected: Collected | None

    @property
    def job_id(self) -> str: ...


class Runs(Protocol):
    """The executor (pipeline.Executor): its lifecycle, state and reporter (recovery tees the
    reporter while it watches), the plan checked per cluster (a relaunch narrows it), what an
    incarnation billed, and a whole run (`--resume`)."""

    lc: Lifecycle
    store: StateStore
    config: Config
    reporter: Reporter
    usable: dict[str, UsablePlan]

    def spent(self, cluster: str, since: float, until: float | None = None,
              incarnation: str | None = None) -> float | None: ...

    def run(self, loaded: LoadedRecipe, cluster_name: str, teardown: Any, runs_dir: Path,
            env_overrides: Mapping[str, str] | None = None, resume: RunRecord | None = None) -> Any: ...


class Recovering(Protocol):
    """What the uploads of a recovering run (recover_upload.py) use of its Recovery (recover.py)."""

    ex: Runs
    r: RunSoFar
    attempts: list[Any]  # recover.Attempt, each written to attempts.json by save()
    watcher: Watcher | None

    def watch(self) -> Watcher: ...

    def gone_now(self) -> tuple[str | None, float]: ...

    def save(self) -> None: ...
