"""Issue 36.1's must-show: a sweep whose trials are spot, with `recover:` on, one trial preempted.

Before, two owners acted on one loss: the trial's pipeline recovered it (`recover:` is on by default
for spot; its watcher relaunched on the slot's cluster, a machine the scheduler did not count) and
the sweep's own watcher reported the VM gone (the scheduler retried the attempt on a new VM). Now
the scheduler alone owns the retry (the trial runs without the pipeline's recovery) and sees the
loss through run's one watcher and gone rule; the retried attempt gets the lost one's checkpoint
through run's one carry.

Against the EC2 fake (moto) whose instances are sshd VMs: the preemption is EC2's spot
termination (`AwsCloud.preempt`: the instance terminated with Server.SpotInstanceTermination, its
VM powered off). What we assert about the cloud we read back from moto through the EC2 API, and
the bill through `cloudtrain cost`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

# Attempt 1 checkpoints (step 1, 2), then waits for the test to preempt its machine; a resumed
# attempt goes on from the kept step and finishes. Every start is recorded with where it resumed.
JOB = """\
set -eu
ckpt="$CLOUDTRAIN_CHECKPOINT_DIR"; mkdir -p "$ckpt"
i=0
if [ -f "$ckpt/state" ]; then read i < "$ckpt/state"; fi
echo "$CLOUDTRAIN_SWEEP_ATTEMPT $i" >> "$MARKS/starts"
while [ "$i" -lt 4 ]; do
  i=$((i + 1))
  echo "$i" > "$ckpt/state.new" && mv "$ckpt/state.new" "$ckpt/state"
  echo "epoch $i/4  loss 0.$i"
  printf '{"cloudtrain":"progress","type":"epoch","epoch":%d,"epochs":4,"loss":0.%d}\\n' "$i" "$i" >> "$CLOUDTRAIN_PROGRESS_FILE"
  if [ "$CLOUDTRAIN_SWEEP_ATTEMPT" = 1 ] && [ "$i" = 2 ]; then
    while [ ! -f "$MARKS/go" ]; do sleep 0.2; done  # until the machine is taken back (go: the test's end)
  fi
done
mkdir -p outputs
echo "{\\"loss\\": $(( (X - 3) * (X - 3) ))}" > outputs/metrics.json
"""


def test_a_preempted_spot_trial_with_recover_on_is_retried_once_by_the_scheduler(
    fake_cloud: Any, tmp_path: Path
) -> None:
    cloud = fake_cloud("aws")
    marks = tmp_path / "marks"
    marks.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    (work / "train.sh").write_text(JOB)
    recipe = cloud.recipe(
        name="spot-sweep", workdir=str(work), run="sh train.sh", results=["outputs"], envs={"MARKS": str(marks)},
        resources={"spot": True}, recover={"max_restarts": 2, "watch_s": 1}, autostop=False,
        sweep={"method": "grid", "parameters": {"X": [3]}, "max_parallel": 1, "budget_usd": 1, "metric": "loss",
               "goal": "min", "trial_deadline_minutes": 4,
               "reserve": {"boot_minutes": 3, "setup_minutes": 3, "collect_minutes": 1, "release_minutes": 1}})
    proc = subprocess.Popen(
        [sys.executable, "-m", "cloudtrain", "sweep", "run", str(recipe), "--runs-dir", str(cloud.runs_dir), "--yes"],
        cwd=cloud.root, env={**os.environ, **cloud.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        starts = marks / "starts"
        wait_until(lambda: starts.exists() and starts.read_text().split() == ["1", "0"], 300, "attempt 1's job")
        # Its checkpoint of step 2 is home (run/checkpoints.py Puller) before the machine goes.
        wait_until(lambda: _kept_step(cloud.runs_dir) == "2", 120, "attempt 1's checkpoint of step 2 on the laptop")
        sweep_id = next(cloud.runs_dir.glob("sweep-*")).name.removeprefix("sweep-")
        (first,) = cloud.instances(f"sw-{sweep_id}-0", states=["running"])
        cloud.preempt(first["InstanceId"])
        out, err = proc.communicate(timeout=420)
    finally:
        (marks / "go").touch()  # attempt 1's job, should its machine outlive the test, ends
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 0, out[-3000:] + err[-3000:]

    # Retried once, by one owner: the scheduler's second attempt, on the one new VM it launched.
    detail = json.loads(cloud.cli("sweep", "status", sweep_id, "--json").stdout)
    assert sorted((a["attempt"], a["state"]) for a in detail["attempts"]) == [(1, "preempted"), (2, "succeeded")]
    assert starts.read_text().splitlines() == ["1 0", "2 2"]  # the retry resumed from the carried checkpoint
    ours = [i for i in cloud.instances() if any(t["Key"] == "cloudtrain-cluster" and t["Value"].startswith(
        f"sw-{sweep_id}-") for t in i.get("Tags", []))]
    assert len(ours) == 2, [(i["InstanceId"], i["State"]["Name"]) for i in ours]  # no relaunch by the pipeline
    assert {i["State"]["Name"] for i in ours} == {"terminated"}
    for run_json in cloud.runs_dir.glob(f"sweep-{sweep_id}/trials/t0000-a*/*/run.json"):
        # Each trial attempt is one pipeline attempt: no recovery of its own inside it.
        assert json.loads(run_json.read_text()).get("attempts") in (None, [], ()), run_json
    assert not list(cloud.runs_dir.glob(f"sweep-{sweep_id}/trials/*/*/attempts.json"))

    # The sweep's spend is what the fake billed: one incarnation per VM, as `cloudtrain cost` says.
    billed = json.loads(cloud.cli("cost", "--json").stdout)["incarnations"]
    bill = {b["incarnation"]: b["usd"] for b in billed if b["cluster"].startswith(f"sw-{sweep_id}-")}
    assert len(bill) == 2, billed
    # Each figure is rounded to the micro-dollar on its own: a sum of two may differ by one more.
    assert abs(detail["spent_usd"] - sum(bill.values())) < 2e-6 + 1e-12, (detail["spent_usd"], bill)
    assert json.loads(cloud.cli("status", "--json").stdout)["clusters"] == []


def _kept_step(runs_dir: Path) -> str | None:
    """The step of the checkpoint attempt 1 kept on the laptop; None while there is none, and for
    the moment a newer copy replaces the directory whole (run/checkpoints.py)."""
    for state in runs_dir.glob("sweep-*/trials/t0000-a1/checkpoint/state"):
        try:
            return state.read_text().strip()
        except FileNotFoundError:
            return None
    return None
