"""What the recovery e2e tests share (docs/recovery.md): a `run:` job that checkpoints into
$CLOUDTRAIN_CHECKPOINT_DIR and can be held mid-run, a recipe for it, the CLI started in the
background, and each cloud fake's way of finding and preempting the cluster's machine.

The job (TRAIN) resumes from $CLOUDTRAIN_CHECKPOINT_DIR, checkpoints there after every step (a new
file, then rename: the contract in docs/recovery.md), then prints an epoch line for people and
appends the epoch's progress event to $CLOUDTRAIN_PROGRESS_FILE (what the laptop acts on). The first
attempt waits after step 3 until the test has preempted its machine (`<marks>/go`), so the loss is
mid-run; a test that wants the loss later touches `go` first. On SIGTERM (the watchdog's, on an
interruption notice) it writes a last checkpoint with a `final` mark that no epoch event announces:
only the notice's pull can bring that one home. The notice TERMs every process of the job, its
`sleep` too: `|| :` keeps `set -e` from ending the script when the sleep dies first, before the TERM
trap has run (dash exits on the failed command and the pending trap never runs). Every start is
appended to `<marks>/starts`.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from cloudtrain.testing.cloud import FakeCloud
from cloudtrain.testing.wait import wait_until

STEPS = 8
TOTAL = sum(i * i for i in range(1, STEPS + 1))  # what the job's result.json says after all steps
# How each cloud's interruption notice reads in a lost attempt's reason (the metadata fakes' words).
NOTICE_SAYS = {"aws": "spot/instance-action", "gcp": "instance/preempted TRUE", "azure": "scheduled event Preempt"}
TRAIN = textwrap.dedent("""\
    set -eu
    ckpt="$CLOUDTRAIN_CHECKPOINT_DIR"; mkdir -p "$ckpt"
    i=0; total=0
    if [ -f "$ckpt/state" ]; then read i total < "$ckpt/state"; fi
    trap 'echo "$i $total" > "$ckpt/state"; echo "$i" > "$ckpt/final"; echo "final checkpoint at step $i"; exit 143' TERM
    echo "start $i $(cat "$ckpt/final" 2>/dev/null || echo -)" >> "$MARKS/starts"
    echo "resuming at step $i"
    while [ "$i" -lt {steps} ]; do
      i=$((i + 1)); total=$((total + i * i))
      echo "$i $total" > "$ckpt/state.new" && mv "$ckpt/state.new" "$ckpt/state"
      echo "epoch $i/{steps}  loss 0.$i"
      printf '{{"cloudtrain":"progress","type":"epoch","epoch":%d,"epochs":{steps}}}\\n' "$i" >> "$CLOUDTRAIN_PROGRESS_FILE"
      if [ "$i" = 3 ] && [ ! -f "$MARKS/go" ]; then
        while [ ! -f "$MARKS/go" ]; do sleep 0.1 || :; done
      fi
      sleep 0.2 || :
    done
    mkdir -p outputs
    echo "{{\\"steps\\": $i, \\"total\\": $total}}" > outputs/result.json
    """).format(steps=STEPS)


def recipe(cloud: FakeCloud, marks: Path, watch_s: float = 1, **fields: Any) -> Path:
    """A spot recipe running TRAIN with recovery on (2 restarts, the watcher every `watch_s`)."""
    work = cloud.root / "work"
    work.mkdir(exist_ok=True)
    (work / "train.sh").write_text(TRAIN)
    return cloud.recipe(
        workdir=str(work), run="sh train.sh", results=["outputs"],
        envs={"MARKS": str(marks)}, resources={"spot": True}, recover={"max_restarts": 2, "watch_s": watch_s},
        **{"autostop": False, **fields})


def kept(cloud: FakeCloud, timeout: float = 300, at_least: int = 0) -> Path:
    """The run's checkpoint kept on the laptop, once there (and at `at_least` or later)."""
    found = wait_until(lambda: next(cloud.runs_dir.glob("*/checkpoint/cloudtrain-checkpoint.json"), None),
                       timeout, "a checkpoint kept on the laptop")
    if at_least:
        wait_until(lambda: (kept_epoch(found) or 0) >= at_least, 60, f"the checkpoint of step {at_least}")
    return found


def kept_epoch(info: Path) -> int | None:
    """The kept checkpoint's epoch (its cloudtrain-checkpoint.json); None while there is none, and
    for the moment a newer copy replaces the directory whole
    (run/checkpoints.py `_replace_dir`: the old one is renamed away, then the new one in)."""
    try:
        return int(json.loads(info.read_text())["epoch"])
    except FileNotFoundError:
        return None


def start(cloud: FakeCloud, recipe_path: Path) -> subprocess.Popen:
    """`cloudtrain run RECIPE --down` in the background (SIGINT at its default, as a user's)."""
    env = {**os.environ, **cloud.env}
    return subprocess.Popen(
        [sys.executable, "-m", "cloudtrain", "run", str(recipe_path), "--cluster", cloud.cluster,
         "--runs-dir", str(cloud.runs_dir), "--down"],
        cwd=cloud.root, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def finish(proc: subprocess.Popen, marks: Path) -> tuple[str, str]:
    """The CLI's output once it ended (the job let go first); killed if it outlives the wait."""
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        (marks / "go").touch()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return out, err


def stop(proc: subprocess.Popen, *gates: Any) -> None:
    """A test's cleanup: the node commands it held let go (NodeCommandGate; None: none held yet),
    then the CLI killed if it still runs."""
    for gate in gates:
        if gate is not None:
            gate.release()
    if proc.poll() is None:
        proc.kill()
        proc.communicate()


def ended(proc: subprocess.Popen, out: str, err: str, code: int = 0) -> tuple[Path, dict[str, Any]]:
    """The run's directory (the CLI's last line) and its run.json, once the CLI exited with `code`."""
    assert proc.returncode == code, out[-3000:] + err[-3000:]
    run_dir = Path(out.strip().splitlines()[-1])
    return run_dir, json.loads((run_dir / "run.json").read_text())


def placement(cloud: FakeCloud) -> tuple[str, str]:
    """(zone, or region on Azure, and the machine's name) of the cluster's running machine."""
    where, machine, _ = _running_machine(cloud)
    return where, machine


def _running_machine(cloud: FakeCloud) -> tuple[str, str, str]:
    if cloud.name == "aws":
        (raw,) = cloud.instances(cloud.cluster, states=["running"])  # type: ignore[attr-defined]
        return raw["Placement"]["AvailabilityZone"], raw["InstanceId"], raw["InstanceId"]
    if cloud.name == "gcp":
        (zone, raw), = [(z, i) for z, i in cloud.instances(cloud.cluster)  # type: ignore[attr-defined]
                        if i["status"] == "RUNNING"]
        return zone, raw["name"], raw["name"]
    vms = [vm for vm in cloud.server.find("Microsoft.Compute/virtualMachines")  # type: ignore[attr-defined]
           if vm.get("tags", {}).get("cloudtrain-cluster") == cloud.cluster
           and vm["properties"].get("_power") == "running"]
    (vm,) = vms
    return vm["location"], vm["name"], vm["id"].lower()


def preempt(cloud: FakeCloud, where: str, machine: str) -> None:
    """The cloud takes the spot machine back, its own way (EC2 terminates, GCE preempts, Azure
    evicts per the VM's evictionPolicy)."""
    if cloud.name == "aws":
        cloud.preempt(machine)  # type: ignore[attr-defined]
    elif cloud.name == "gcp":
        cloud.server.preempt(where, machine)  # type: ignore[attr-defined]
    else:
        cloud.server.evict(machine)  # type: ignore[attr-defined]


def running(cloud: FakeCloud) -> tuple[str, str, Any] | None:
    """(zone or region, machine, its sshd VM) once the cluster's machine runs and its VM has booted."""
    try:
        where, machine, key = _running_machine(cloud)
        vm = cloud.vm(where, machine) if cloud.name == "gcp" else cloud.machines.vm(key)  # type: ignore[attr-defined]
        return where, machine, vm
    except (ValueError, KeyError):  # not running, or its VM not booted, yet
        return None
