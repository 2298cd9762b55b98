"""The one attempt loop (run/controller.py): the Controller asks its policy "again or done" after
each attempt. In process, no cloud: a scripted attempt, and each policy (once, a recovering run's,
a sweep trial's). The recovering policy is run/recover.Recovery itself, with a scripted watcher in
place of its thread on the cloud; its relaunch is on machines with nowhere else to go (no plan)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.config import Config
from cloudtrain.errors import JobFailedError, LaunchLostError, LostLaunch, RemoteError, UsageError
from cloudtrain.recipe import LoadedRecipe, Recipe
from cloudtrain.run import follow
from cloudtrain.run.collect import Collected
from cloudtrain.run.controller import Controller, Once, ReserveSpent, Trial
from cloudtrain.run.pipeline import _PhaseClock, _Run
from cloudtrain.run.recover import ATTEMPTS_FILE, Recovery
from cloudtrain.run.recover_rules import NodeLostError
from cloudtrain.run.stop import StopToken
from cloudtrain.state import StateStore

pytestmark = pytest.mark.quick


class _Said:
    def __init__(self) -> None:
        self.said: list[tuple[str, str]] = []

    def phase_start(self, phase: str, detail: str = "") -> None:
        self.said.append(("start", phase))

    def phase_end(self, phase: str, seconds: float, detail: str = "", ok: bool = True) -> None:
        self.said.append(("end", f"{phase}: {detail}"))

    def log_line(self, line: str, node: int = 0) -> None:
        self.said.append(("line", line))

    def progress(self, event: dict[str, Any]) -> None:
        self.said.append(("progress", json.dumps(event)))

    def info(self, message: str) -> None:
        self.said.append(("info", message))

    def warn(self, message: str) -> None:
        self.said.append(("warn", message))


def _run(tmp_path: Path, reporter: _Said, **fields: Any) -> _Run:
    recipe = Recipe.model_validate({"name": "r", "run": "true", **fields})
    loaded = LoadedRecipe(recipe=recipe, path=tmp_path / "r.yaml", digest="d", workdir=None, data_sources=())
    run_dir = tmp_path / "run"
    run_dir.mkdir(parents=True)
    return _Run("c-run", run_dir, loaded, _PhaseClock(reporter), time.time())  # type: ignore[arg-type]


def _script(*steps: BaseException | Callable[[], None] | None) -> tuple[Callable[[], None], list[int]]:
    """An attempt that raises (or runs) the next step each time; the count of attempts made."""
    made: list[int] = []

    def attempt() -> None:
        made.append(1)
        step = steps[len(made) - 1]
        if isinstance(step, BaseException):
            raise step
        if step is not None:
            step()
    return attempt, made


# once -----------------------------------------------------------------------------------------------

def test_once_runs_one_attempt_whatever_happens(tmp_path: Path) -> None:
    r = _run(tmp_path, _Said())
    attempt, made = _script(None)
    Controller(Once()).run(r, attempt)
    assert len(made) == 1
    attempt, made = _script(RemoteError("ssh: connection closed"), None)
    with pytest.raises(RemoteError):
        Controller(Once()).run(r, attempt)
    assert len(made) == 1
    attempt, made = _script(KeyboardInterrupt(), None)
    with pytest.raises(KeyboardInterrupt):
        Controller(Once()).run(r, attempt)
    assert len(made) == 1


# a sweep trial --------------------------------------------------------------------------------------

class _Puller:
    def __init__(self) -> None:
        self.epochs: list[int] = []

    def epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


def test_a_trial_is_one_attempt_under_its_token_and_checks_its_reserve_before_the_job(tmp_path: Path) -> None:
    r = _run(tmp_path, _Said())
    token, puller, warned = StopToken("c"), _Puller(), []
    values: list[dict[str, Any]] = []
    trial = Trial(token, time.time() + 60, ".cloudtrain-checkpoints/t0000", warned.append, puller,  # type: ignore[arg-type]
                  on_epoch=values.append)
    attempt, made = _script(RemoteError("the VM went"), None)
    with pytest.raises(RemoteError):  # a loss is the scheduler's to retry, never retried in place
        Controller(trial).run(r, attempt)
    assert len(made) == 1 and r.clock.stop is token  # collect after it honours the token too
    for epoch in (3, 3, 2):  # a job that prints and writes its events: each epoch is heard once
        trial.progress({"cloudtrain": "progress", "type": "epoch", "epoch": epoch, "val_accuracy": 0.5})
    trial.progress({"cloudtrain": "progress", "type": "step", "epoch": 4, "step": 20})
    trial.before_job([])  # within its reserve, nothing carried: nothing to do
    assert puller.epochs == [3] and [v["epoch"] for v in values] == [3] and warned == []
    late = Trial(token, time.time() - 1, ".cloudtrain-checkpoints/t0000", warned.append)
    with pytest.raises(ReserveSpent, match="reserved for them"):
        late.before_job([])


# a recovering run -----------------------------------------------------------------------------------

class _Lc:
    def __init__(self) -> None:
        self.downs: list[str] = []

    def launches_priced(self, recipe: Recipe) -> bool:
        return False  # machines with nowhere else to go: the same place again, no plan to make

    def down(self, name: str) -> bool:
        self.downs.append(name)
        return True


class _Executor:
    def __init__(self, tmp_path: Path, reporter: _Said) -> None:
        self.lc: Any = _Lc()
        self.store = StateStore(tmp_path / "state.db")
        self.config = Config()
        self.reporter: Any = reporter
        self.usable: dict[str, Any] = {}

    def spent(self, cluster: str, since: float, until: float | None = None,
              incarnation: str | None = None) -> float | None:
        return None


class _Watcher:
    """What the cloud watcher saw during one attempt: its loss, or nothing."""

    def __init__(self, lost: str | None) -> None:
        self.lost = lost
        self.detected_at = time.time() if lost else None

    def stop(self, join: bool = True) -> None:
        return None


class _Recovery(Recovery):
    """Recovery with each attempt's watcher scripted (the real one asks the cloud in a thread)."""

    seen: list[str | None] = []

    def watch(self) -> Any:
        self.token = StopToken(self.name)
        self.r.clock.stop = self.token
        self.watcher = _Watcher(self.seen.pop(0) if self.seen else None)  # type: ignore[assignment]
        return self.watcher


def _recovery(tmp_path: Path, seen: list[str | None], max_restarts: int = 2) -> tuple[_Recovery, _Run, _Said]:
    reporter = _Said()
    r = _run(tmp_path, reporter, recover={"max_restarts": max_restarts})
    ex = _Executor(tmp_path, reporter)
    assert r.loaded.recipe.recovery is not None
    recovery = _Recovery(ex, r, "c", r.loaded.recipe.recovery)  # type: ignore[arg-type]
    recovery.seen = list(seen)
    return recovery, r, reporter


def _outcomes(recovery: Recovery) -> list[tuple[str, str | None]]:
    saved = json.loads((recovery.r.run_dir / ATTEMPTS_FILE).read_text())
    assert [a["outcome"] for a in saved] == [a.outcome for a in recovery.attempts]
    return [(a.outcome, a.reason) for a in recovery.attempts]


def test_a_recovering_run_relaunches_each_loss_and_ends_at_the_first_success(tmp_path: Path) -> None:
    recovery, r, reporter = _recovery(tmp_path, ["gcp reports n-0 terminated", None, None])
    lost = LostLaunch("aws", "us-east-1", "us-east-1a", "g5.xlarge", True, 0.5, "uid-2")
    attempt, made = _script(RemoteError("ssh: connection closed"), LaunchLostError("reclaimed at boot", lost), None)
    Controller(recovery).run(r, attempt)
    assert len(made) == 3
    assert _outcomes(recovery) == [("lost", "gcp reports n-0 terminated"), ("preempted", "reclaimed at boot"),
                                   ("succeeded", None)]
    assert recovery.attempts[1].zone == "us-east-1a"  # a lost launch says where it was itself
    assert ("start", "recover") in reporter.said
    assert recovery.ex.reporter is reporter and r.clock.reporter is reporter and r.clock.stop is None


def test_a_recovering_run_does_not_retry_what_is_no_loss(tmp_path: Path) -> None:
    recovery, r, _ = _recovery(tmp_path, [None])
    attempt, made = _script(JobFailedError("job on node 0 failed (exit code 3)", 3), None)
    with pytest.raises(JobFailedError):
        Controller(recovery).run(r, attempt)
    assert len(made) == 1 and _outcomes(recovery) == [("failed", "job on node 0 failed (exit code 3)")]

    # Bad input is never a loss, whatever the watcher saw; Ctrl-C ends the run.
    for error, outcome in ((UsageError("no such bucket"), "failed"), (KeyboardInterrupt(), "interrupted")):
        recovery, r, _ = _recovery(tmp_path / outcome, ["gone"])
        attempt, made = _script(error, None)
        with pytest.raises(type(error)):
            Controller(recovery).run(r, attempt)
        assert len(made) == 1 and [a.outcome for a in recovery.attempts] == [outcome]


def test_a_node_lost_while_collecting_is_relaunched_and_collects_again(tmp_path: Path) -> None:
    recovery, r, _ = _recovery(tmp_path, ["n-0 terminated", None])

    def collected(complete: bool) -> Callable[[], None]:
        def step() -> None:
            r.collected = Collected() if complete else Collected(error="ssh: connection closed")
        return step
    attempt, made = _script(collected(False), collected(True))
    Controller(recovery).run(r, attempt)
    assert len(made) == 2
    assert _outcomes(recovery) == [("lost", "n-0 terminated (while collecting the results)"), ("succeeded", None)]


def test_a_recovering_run_stops_relaunching_when_its_restarts_are_spent(tmp_path: Path) -> None:
    recovery, r, _ = _recovery(tmp_path, ["gone once", "gone twice"], max_restarts=1)
    attempt, made = _script(RemoteError("closed"), RemoteError("closed"), None)
    with pytest.raises(NodeLostError, match=r"max_restarts \(1\)") as raised:
        Controller(recovery).run(r, attempt)
    assert isinstance(raised.value.__cause__, RemoteError)
    assert len(made) == 2 and [a.outcome for a in recovery.attempts] == ["lost", "lost"]


# epochs are the controller's, beside the reporter ------------------------------------------------------

def test_the_policy_hears_the_jobs_progress_events_never_its_words_for_people() -> None:
    reporter, events = _Said(), []
    # The bundled job's readable epoch line is for people: no event (no regex reads the log).
    follow._emit("epoch 2/8  loss 0.5", 0, reporter, None, True, events.append)  # type: ignore[arg-type]
    line = json.dumps({"cloudtrain": "progress", "type": "epoch", "epoch": 4, "epochs": 8})
    follow._emit(line, 0, reporter, None, True, events.append)  # type: ignore[arg-type]  (the protocol, printed)
    # What the job appends to CLOUDTRAIN_PROGRESS_FILE comes beside the log, in pieces of any size.
    beside = follow._Events(events.append)
    first = b'{"cloudtrain":"progress","type":"epoch","epoch":5,"epochs":8}\n'
    beside.feed(first + b'{"cloudtrain":"progr')
    assert beside.asked == len(first) + len(b'{"cloudtrain":"progr')  # a resume goes on after what came
    beside.feed(b'ess","type":"epoch","epoch":6,"epochs":8}\nnot an event\n')
    assert [e["epoch"] for e in events] == [4, 5, 6]
    assert [kind for kind, _ in reporter.said] == ["line", "progress"]
    assert follow._Events(None).asked is None  # nobody listens: the node is asked for no events
