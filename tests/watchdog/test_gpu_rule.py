"""autostop.gpu_util_below (issue 39.2): a job that runs while every GPU idles is no activity.

gpu_rule as a table (the decision from the samples), the job-id patterns that keep setup and bucket
copies busy, and the real watchdog on this machine with a scripted nvidia-smi on its PATH: quiet
GPUs under a job stop the node; a busy GPU, a hung or failing sampler, or a setup never do (the
samplers that hang or fail are proven here only). On the AWS fake, through `cloudtrain up`, a busy
GPU holding the node up and quiet GPUs stopping it: tests/watchdog/test_aws.py.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudtrain.node.signals import gpu_rule, sample_gpus
from tests.watchdog.conftest import (
    FakeGpus,
    NodeDir,
    decisions,
    marker_command,
    wait_busy_beyond_idle,
    wait_until,
)

IDLE_S = 1.5
TICK_S = 0.2
SAMPLE_S = 0.2


@pytest.mark.parametrize(("samples", "now", "verdict", "since", "said"), [
    ([], 100.0, "busy", None, "no sample yet"),
    # Quiet for the whole window (60 s): idle, counted from the first quiet sample.
    ([(t, [0.0, 3.0]) for t in range(30, 101, 10)], 100.0, "idle", 30, "0%,3% < 10% for 70/60s (8 sample(s))"),
    # Quiet, not yet for the window.
    ([(t, [0.0]) for t in range(60, 101, 10)], 100.0, "quiet", 60, "for 40/60s"),
    # One GPU of two at the threshold: busy (every GPU must be below it).
    ([(90, [0.0, 0.0]), (100, [0.0, 10.0])], 100.0, "busy", None, "0%,10% (not all < 10%)"),
    # Just below it counts as quiet.
    ([(100, [9.9])], 100.0, "quiet", 100, "9.9% < 10%"),
    # A busy sample inside the window: the quiet run starts after it, not at the window's start.
    ([(0, [0.0]), (50, [80.0]), (60, [0.0]), (100, [0.0])], 100.0, "quiet", 60, "for 40/60s (2 sample(s))"),
    # A failed sample (nvidia-smi missing, exit 1, timed out) is busy, last or inside the run.
    ([(90, [0.0]), (100, None)], 100.0, "busy", None, "the last sample failed"),
    ([(0, [0.0]), (40, None), (50, [0.0]), (100, [0.0])], 100.0, "quiet", 50, "for 50/60s"),
    # Busy again after quiet: busy.
    ([(t, [0.0]) for t in range(0, 100, 10)] + [(100, [55.0])], 100.0, "busy", None, "55%"),
])
def test_gpu_rule(samples: list, now: float, verdict: str, since: float | None, said: str) -> None:
    got_verdict, got_since, text = gpu_rule(samples, 10.0, 60.0, now)
    assert (got_verdict, got_since) == (verdict, since), text
    assert said in text


def test_setup_and_copy_job_ids_are_the_patterns_the_node_keeps_busy() -> None:
    import fnmatch

    from cloudtrain.run.collect import job_ids
    from cloudtrain.run.watchdog import BUSY_JOBS

    (run_job, _), (setup_job, _) = job_ids("run-20260101-abcd")
    busy = {name: any(fnmatch.fnmatchcase(name, p) for p in BUSY_JOBS)
            for name in (setup_job, "setup-20260101-120000-ab12", "run-20260101-abcd-data", "run-20260101-abcd-upload",
                         run_job, "exec-20260101-120000-ab12")}
    assert busy == {setup_job: True, "setup-20260101-120000-ab12": True, "run-20260101-abcd-data": True,
                    "run-20260101-abcd-upload": True, run_job: False, "exec-20260101-120000-ab12": False}


def test_the_sampler_reads_every_gpu_and_a_hung_one_is_ended(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    gpus = FakeGpus(tmp_path / "bin", tmp_path / "gpu")
    monkeypatch.setenv("PATH", f"{gpus.bin_dir}:{os.environ['PATH']}")
    gpus.set("0 42")
    assert sample_gpus() == ([0.0, 42.0], "0%,42%")
    gpus.set("fail")
    values, why = sample_gpus()
    assert values is None and why.startswith("nvidia-smi exited 1: NVIDIA-SMI has failed")
    gpus.set("hang")
    values, why = sample_gpus(timeout=0.5)
    assert values is None and why == "nvidia-smi timed out after 0.5s"
    gpus.set("[N/A]")
    assert sample_gpus()[0] is None
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    values, why = sample_gpus()
    assert values is None and "FileNotFoundError" in why


def _armed(node: NodeDir, marker: Path) -> dict:
    return node.write(tick_s=TICK_S, gpu_sample_s=SAMPLE_S, busy_jobs=["*-setup", "setup-*", "*-data", "*-upload"],
                      autostop={"idle_s": IDLE_S, "down": False, "wait_for": "jobs", "gpu_util_below": 10},
                      action={"kind": "shutdown", "effect": "stop"}, shutdown_command=marker_command(marker))


@pytest.mark.parametrize(("mode", "reason"), [
    ("50 0", "gpu 50%,0% (not all < 10%)"),
    ("hang", "nvidia-smi timed out"),
    ("fail", "nvidia-smi exited 1"),
])
def test_a_busy_gpu_or_a_broken_sampler_keeps_the_job_busy_then_quiet_gpus_stop_the_node(
        node_dir: NodeDir, tmp_path: Path, mode: str, reason: str) -> None:
    marker = tmp_path / "powered-off"
    gpus = FakeGpus(tmp_path / "bin", tmp_path / "gpu")
    gpus.set(mode)
    node_dir.start_job("run-1-run", "sleep 300")
    _armed(node_dir, marker)
    node_dir.run(env={"PATH": f"{gpus.bin_dir}:{os.environ['PATH']}"})
    wait_busy_beyond_idle(node_dir.log, IDLE_S, TICK_S, reason)
    assert not marker.exists()
    gpus.set("0 0")
    wait_until(marker.exists, what="the stop once the GPUs went quiet")
    log = decisions(node_dir.log)
    (stop,) = [detail for d, detail in log if d == "stop" and "->" in detail]
    assert stop.startswith("autostop: idle")
    # Every decision says what the GPUs said; the idle ones count from the quiet run's first sample.
    assert any(d == "idle" and "since the GPUs went quiet" in detail and "gpu 0%,0% < 10% for" in detail
               for d, detail in log)


def test_quiet_gpus_during_setup_never_stop_the_node(node_dir: NodeDir, tmp_path: Path) -> None:
    marker = tmp_path / "powered-off"
    gpus = FakeGpus(tmp_path / "bin", tmp_path / "gpu")
    gpus.set("0")
    setup = node_dir.start_job("run-1-setup", "sleep 300")
    _armed(node_dir, marker)
    node_dir.run(env={"PATH": f"{gpus.bin_dir}:{os.environ['PATH']}"})
    wait_busy_beyond_idle(node_dir.log, IDLE_S, TICK_S, "setup or copy (run-1-setup): busy whatever the GPUs do")
    assert not marker.exists() and gpus.calls == 0  # nothing to judge: not even sampled
    node_dir.kill_job(setup)
    node_dir.start_job("run-1-run", "sleep 300")  # the job, at 0% too: judged, and stopped
    wait_until(marker.exists, what="the stop under the idle job")
