"""What a verb costs on each cloud: warm `exec`, `logs`, `status --refresh` and `down` on clusters
of the AWS, GCP and Azure fakes, next to the same verbs on an `ssh` cluster, in one run.

Every cluster's machine is the test kit's sshd VM (cloudtrain.testing.sshd, the same sshd binary
and config for all four); the clouds' APIs are the kit's fakes (moto for EC2, the fake Compute
Engine, the fake ARM), all on loopback. So what differs between a cloud's row and ssh's is what
cloudtrain does for that cloud: which SDK it imports, which API calls it makes, the ProxyCommand
that routes a fake public IP to its VM. Network distance is not added (the fakes' ProxyCommand
takes no latency): a cloud call a verb makes would cost one more round trip per call over a WAN.

  exec     `cloudtrain exec NAME -- true`, the recipe's workdir (20 files) unchanged since the last
           exec: the warm path (connection reuse on, ssh.persist_s's default)
  logs     `cloudtrain logs NAME` (the last exec's job)
  status   `cloudtrain status NAME --refresh` (asks the cloud about the cluster's machines)
  down     `cloudtrain down NAME` (one sample per cloud: it ends the cluster)

Each figure is the median of --repeat wall times of the CLI as a subprocess; the clouds take turns
within each repetition, so a busy machine slows them alike. Printed per verb: seconds per cloud and
the ratio to ssh (status: also to AWS), and the cloud SDK modules each verb imported (-X importtime,
one extra run).

Goals (issue 36): exec and logs <= 1.2x of ssh on every cloud; status --refresh on GCP and Azure
<= 1.5x of AWS.

    .venv/bin/python benchmarks/verb_cost.py [--repeat 5] [--clouds ssh,aws,gcp,azure]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
# Each verb is timed as a user starts it: a fresh interpreter importing what the verb needs, not a
# fork of the test kit's preloaded CLI server (cloudtrain/testing/forkcli.py), which hides imports.
os.environ["CLOUDTRAIN_TEST_FORK_CLI"] = "0"

VERBS = ("exec", "logs", "status")
GOAL_TO_SSH = {"exec": 1.2, "logs": 1.2}
GOAL_STATUS_TO_AWS = 1.5
SDK_PREFIXES = ("boto3", "botocore", "google.cloud.compute_v1", "google.auth", "google.api_core", "azure.core",
                "azure.identity", "azure.mgmt.compute", "azure.mgmt.network", "azure.mgmt.resource")


def argv_of(verb: str, cluster: str) -> list[str]:
    return {"exec": ["exec", cluster, "--", "true"], "logs": ["logs", cluster],
            "status": ["status", cluster, "--refresh"], "down": ["down", cluster]}[verb]


def timed(cloud: Any, args: list[str]) -> float:
    started = time.perf_counter()
    result = cloud.cli(*args)
    elapsed = time.perf_counter() - started
    if not result.ok:
        raise SystemExit(f"{cloud.name}: cloudtrain {' '.join(args)} failed:\n{result.output[-3000:]}")
    return elapsed


def sdk_imports(cloud: Any, args: list[str]) -> list[str]:
    """The cloud SDK packages (of SDK_PREFIXES) `cloudtrain ARGS` imports."""
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "cloudtrain", *args], cwd=str(cloud.root),
                          env={**os.environ, **cloud.env}, capture_output=True, text=True, check=False)
    names = {line.rsplit("|", 1)[1].strip() for line in proc.stderr.splitlines()[1:] if line.startswith("import time:")}
    return [p for p in SDK_PREFIXES if any(n == p or n.startswith(p + ".") for n in names)]


def make_workdir(root: Path) -> Path:
    path = root / "project"
    for i in range(20):
        (path / f"pkg{i % 4}").mkdir(parents=True, exist_ok=True)
        (path / f"pkg{i % 4}" / f"mod{i}.py").write_text(f"VALUE = {i}\n" * 50)
    return path


@contextlib.contextmanager
def clouds(root: Path, names: list[str]) -> Iterator[dict[str, Any]]:
    """The named clouds, each with its own home, config and fake; torn down on the way out."""
    import pytest

    from cloudtrain.testing.cloud import CloudMachines, SshCloud, cloud_outside_pytest
    from cloudtrain.testing.sshd import SshdFactory

    made: dict[str, Any] = {}
    with contextlib.ExitStack() as stack:
        for name in names:
            where = root / name
            if name == "ssh":
                factory = stack.enter_context(contextlib.closing(SshdFactory(where / "vms")))
                mp = stack.enter_context(pytest.MonkeyPatch.context())
                made[name] = SshCloud(where / "cloud", mp, factory, hint="verb-cost")
                stack.callback(made[name].close)
                stack.callback(made[name].down)  # first: whatever is still up goes
            elif name == "aws":
                from cloudtrain.testing.aws import AwsCloud, MotoServer, isolate_aws_env

                server = MotoServer().start()
                stack.callback(server.stop)
                factory = stack.enter_context(contextlib.closing(SshdFactory(where / "vms")))
                mp = stack.enter_context(pytest.MonkeyPatch.context())
                where.mkdir(parents=True, exist_ok=True)
                isolate_aws_env(mp, where, server.env())
                cloud = AwsCloud(where / "cloud", mp, server, CloudMachines(factory), hint="verb-cost")
                stack.callback(cloud.close)
                stack.callback(cloud.down)
                made[name] = cloud
            elif name == "gcp":
                from cloudtrain.testing.gcp import _GCP_VARS_TO_CLEAR, GceServer, GcpCloud

                made[name] = stack.enter_context(cloud_outside_pytest(
                    where, GceServer(where / "gce").start(), _GCP_VARS_TO_CLEAR, GcpCloud, hint="verb-cost"))
            elif name == "azure":
                from cloudtrain.testing.azure import _AZURE_VARS_TO_CLEAR, ArmServer, AzureCloud

                made[name] = stack.enter_context(cloud_outside_pytest(
                    where, ArmServer(where / "arm").start(), _AZURE_VARS_TO_CLEAR, AzureCloud, hint="verb-cost"))
            else:
                raise SystemExit(f"--clouds: unknown cloud {name!r} (ssh, aws, gcp, azure)")
        yield made


def ratio(value: float, base: float | None) -> str:
    return f"{value / base:5.2f}x" if base else "    - "


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--clouds", default="ssh,aws,gcp,azure")
    args = parser.parse_args()
    names = [n.strip() for n in args.clouds.split(",") if n.strip()]
    times: dict[tuple[str, str], list[float]] = {}
    sdks: dict[tuple[str, str], list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="ct-verbcost-") as tmp, clouds(Path(tmp), names) as made:
        for name, cloud in made.items():
            recipe = cloud.recipe(run="true", workdir=str(make_workdir(cloud.root)))
            started = time.perf_counter()
            timed(cloud, ["up", str(recipe), "--cluster", cloud.cluster])
            print(f"{name}: up in {time.perf_counter() - started:.1f} s", flush=True)
            timed(cloud, argv_of("exec", cloud.cluster))  # the first exec after up: not what is measured
        for _ in range(args.repeat):
            for verb in VERBS:
                for name, cloud in made.items():
                    times.setdefault((verb, name), []).append(timed(cloud, argv_of(verb, cloud.cluster)))
        for verb in VERBS:
            for name, cloud in made.items():
                sdks[(verb, name)] = sdk_imports(cloud, argv_of(verb, cloud.cluster))
        for name, cloud in made.items():
            times[("down", name)] = [timed(cloud, argv_of("down", cloud.cluster))]

    median = {key: statistics.median(values) for key, values in times.items()}
    print(f"\nmedian of {args.repeat} (down: 1 sample), seconds; loopback, no added RTT")
    print(f"{'verb':<16} {'cloud':<6} {'s':>6} {'/ssh':>7} {'/aws':>7}  goal / SDK modules imported")
    failed = False
    for verb in (*VERBS, "down"):
        base_ssh, base_aws = median.get((verb, "ssh")), median.get((verb, "aws"))
        for name in names:
            value = median[(verb, name)]
            note = ""
            if verb in GOAL_TO_SSH and name != "ssh" and base_ssh:
                ok = value / base_ssh <= GOAL_TO_SSH[verb]
                failed |= not ok
                note = f"{'ok' if ok else 'OVER'} (<= {GOAL_TO_SSH[verb]}x ssh)"
            elif verb == "status" and name in ("gcp", "azure") and base_aws:
                ok = value / base_aws <= GOAL_STATUS_TO_AWS
                failed |= not ok
                note = f"{'ok' if ok else 'OVER'} (<= {GOAL_STATUS_TO_AWS}x aws)"
            imported = sdks.get((verb, name))
            if imported is not None:
                note += ("; " if note else "") + (", ".join(imported) if imported else "no SDK")
            label = "status --refresh" if verb == "status" else verb
            print(f"{label:<16} {name:<6} {value:6.2f} {ratio(value, base_ssh)} {ratio(value, base_aws)}  {note}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
