"""Recovery from a preemption, per cloud fake: detection time, time to the job running again, epochs lost.

Each leg runs `cloudtrain run` (the real CLI) on a spot recipe with `recover:` at its defaults
(watch_s 10 s) against a cloud fake whose machines are sshd VMs on this host. The job trains one
"epoch" a second for 30 epochs, checkpointing into $CLOUDTRAIN_CHECKPOINT_DIR after each and
printing `epoch N/30`; it stamps every epoch and every start into a file here. After epoch 4 the
leg preempts the machine the way its cloud does (EC2: terminated with Server.SpotInstanceTermination;
Compute Engine: its instanceTerminationAction; Azure: evicted), then reads:

  detection      preemption -> the CLI knows (run.json attempts[0].detected_at)
  running again  preemption -> the relaunched job's first line on the new machine (its start stamp)
  epochs lost    the last epoch finished before the preemption minus the epoch the relaunch resumed at
  first start    for scale: `cloudtrain run` started -> the first attempt's job running (the same
                 launch, connect and node bootstrap a relaunch goes through, without detection)

Baseline, in the same run: the `aws-ssh` leg is the AWS leg with the cloud watcher slowed to 300 s,
so the loss is seen only when the pipeline's SSH retries give up and the cloud is asked then (what
waiting out SSH retries costs; the fixtures' ssh.connect_retries_s is 30 s, a user's default 300 s).
Peers, not run here (they need real clouds): SkyPilot's managed-jobs controller polls every ~15 s on
a VM of its own; dstack notices in 2 to 20 minutes (its issue #2732). The fakes boot a VM in well
under a second: a real cloud adds its boot time to "running again".

    .venv/bin/python benchmarks/recovery.py [--legs aws,gcp,azure,aws-ssh]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
EPOCHS = 30
PREEMPT_AFTER = 4
JOB = f"""\
ckpt="$CLOUDTRAIN_CHECKPOINT_DIR"; mkdir -p "$ckpt"
i=0
if [ -f "$ckpt/step" ]; then i=$(cat "$ckpt/step"); fi
echo "start $i $(python3 -c 'import time; print(time.time())')" >> "$MARKS"
while [ "$i" -lt {EPOCHS} ]; do
  sleep 1; i=$((i + 1))
  echo "$i" > "$ckpt/step.new" && mv "$ckpt/step.new" "$ckpt/step"
  echo "epoch $i $(python3 -c 'import time; print(time.time())')" >> "$MARKS"
  echo "epoch $i/{EPOCHS}  loss 0.5"
done
"""


def marks(path: Path) -> list[tuple[str, int, float]]:
    try:
        lines = path.read_text().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        kind, number, at = line.split()
        out.append((kind, int(number), float(at)))
    return out


def measure(cloud: Any, watch_s: float, machine_of: Callable[[Any], tuple[str, str]],
            preempt: Callable[[Any, str, str], None]) -> dict[str, float]:
    from cloudtrain.testing.wait import wait_until

    stamps = cloud.root / "marks"
    recipe = cloud.recipe(run=JOB, envs={"MARKS": str(stamps)}, resources={"spot": True},
                          recover={"watch_s": watch_s}, autostop=False)
    launched = time.time()
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "run", str(recipe), "--cluster", cloud.cluster,
                             "--runs-dir", str(cloud.runs_dir), "--down", "-q"], cwd=cloud.root,
                            env={**os.environ, **cloud.env}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_until(lambda: any(k == "epoch" and n >= PREEMPT_AFTER for k, n, _ in marks(stamps)), 300,
                 f"epoch {PREEMPT_AFTER}")
        where, machine = machine_of(cloud)
        preempted = time.time()
        preempt(cloud, where, machine)
        out, err = proc.communicate(timeout=900)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    if proc.returncode != 0:
        raise RuntimeError(f"run failed: {out[-2000:]}{err[-2000:]}")
    run_dir = Path(out.strip().splitlines()[-1])
    first = json.loads((run_dir / "run.json").read_text())["attempts"][0]
    seen = marks(stamps)
    done_before = max(n for k, n, at in seen if k == "epoch" and at < preempted)
    restart = [(n, at) for k, n, at in seen if k == "start" and at > preempted][0]
    first_start = [at for k, _, at in seen if k == "start"][0]
    return {"detect_s": first["detected_at"] - preempted, "running_s": restart[1] - preempted,
            "lost": done_before - restart[0], "first_s": first_start - launched}


def _aws(root: Path, watch_s: float) -> dict[str, float]:
    import pytest

    from cloudtrain.testing.aws import AwsCloud, MotoServer, isolate_aws_env
    from cloudtrain.testing.cloud import CloudMachines
    from cloudtrain.testing.sshd import SshdFactory

    server, factory = MotoServer().start(), SshdFactory(root / "vms")
    try:
        with pytest.MonkeyPatch.context() as mp:
            isolate_aws_env(mp, root, server.env())
            cloud = AwsCloud(root / "aws", mp, server, CloudMachines(factory), hint="recovery")
            try:
                def machine(c: AwsCloud) -> tuple[str, str]:
                    (raw,) = c.instances(c.cluster, states=["running"])
                    return raw["Placement"]["AvailabilityZone"], raw["InstanceId"]

                return measure(cloud, watch_s, machine, lambda c, where, m: c.preempt(m))
            finally:
                cloud.down()
                cloud.close()
    finally:
        factory.close()
        server.stop()


def _api(root: Path, server: Any, clear: list[str], make: Callable[..., Any],
         machine: Callable[[Any], tuple[str, str]], preempt: Callable[[Any, str, str], None]) -> dict[str, float]:
    from cloudtrain.testing.cloud import cloud_outside_pytest

    with cloud_outside_pytest(root, server, clear, make, hint="recovery") as cloud:
        return measure(cloud, 10.0, machine, preempt)


def _gcp(root: Path) -> dict[str, float]:
    from cloudtrain.testing.gcp import _GCP_VARS_TO_CLEAR, GceServer, GcpCloud

    def machine(cloud: GcpCloud) -> tuple[str, str]:
        ((zone, raw),) = [(z, i) for z, i in cloud.instances(cloud.cluster) if i["status"] == "RUNNING"]
        return zone, raw["name"]

    return _api(root, GceServer(root / "gce").start(), list(_GCP_VARS_TO_CLEAR), GcpCloud, machine,
                lambda cloud, zone, name: cloud.server.preempt(zone, name))


def _azure(root: Path) -> dict[str, float]:
    from cloudtrain.testing.azure import _AZURE_VARS_TO_CLEAR, ArmServer, AzureCloud

    def machine(cloud: AzureCloud) -> tuple[str, str]:
        (vm,) = [vm for vm in cloud.server.find("Microsoft.Compute/virtualMachines")
                 if vm.get("tags", {}).get("cloudtrain-cluster") == cloud.cluster
                 and vm["properties"].get("_power") == "running"]
        return vm["location"], vm["name"]

    return _api(root, ArmServer(root / "arm").start(), list(_AZURE_VARS_TO_CLEAR), AzureCloud, machine,
                lambda cloud, region, name: cloud.server.evict(name))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--legs", default="aws,gcp,azure,aws-ssh")
    args = parser.parse_args()
    legs = {"aws": lambda root: _aws(root, 10.0), "gcp": _gcp, "azure": _azure,
            "aws-ssh": lambda root: _aws(root, 300.0)}
    chosen = [name.strip() for name in args.legs.split(",") if name.strip()]
    print(f"a spot run: job, {EPOCHS} one-second epochs, preempted after epoch {PREEMPT_AFTER}; recover: defaults")
    print(f"{'leg':<8} {'detection':>10} {'running again':>14} {'epochs lost':>12} {'first start':>12}")
    failed = False
    with tempfile.TemporaryDirectory(prefix="ct-recovery-") as tmp:
        for name in chosen:  # one after the other: the legs time each other's CPU otherwise
            try:
                got = legs[name](Path(tmp) / name)
            except Exception as exc:  # noqa: BLE001 - reported per leg
                print(f"{name:<8} failed: {type(exc).__name__}: {str(exc)[:300]}")
                failed = True
                continue
            print(f"{name:<8} {got['detect_s']:>9.1f}s {got['running_s']:>13.1f}s {got['lost']:>12.0f} "
                  f"{got['first_s']:>11.1f}s", flush=True)
    print("peers (documented, not run): SkyPilot managed jobs ~15 s polling on a paid controller VM; "
          "dstack 2-20 min (issue #2732)")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
