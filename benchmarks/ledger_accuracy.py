"""Ledger accuracy: what `cloudtrain cost --json` reports against what the cloud bills, per scenario.

The baseline is the fake's own bill (cloudtrain/testing/bill.py): moto's server with sshd VMs, every
instance's life recorded as moto changed it, priced with EC2's rules (compute per start with a 60 s
minimum, EBS volumes from creation to deletion). Each scenario drives the real CLI as a user would,
then compares at one moment:

  short       `run --down` of a one-line job: a VM shorter than the billing minimum
  stopped     `up`, then EC2 stops the VM behind cloudtrain's back (the watchdog, the console);
              `cost` 75 s after launch
  reused      `up`, `down`, `up`, `down` on one name: two incarnations
  lost        the CLI SIGKILLed while EC2's RunInstances answer is in flight, then `stop`
  deadline    the CLI SIGKILLed during boot with a 72 s budget: the VM ends by the deadline in
              its launch request (both ends of its life known only from EC2's whole-second times)
  hup         SIGHUP (a closed terminal) while `up` waits for RunInstances

Printed: reported $, billed $, reported / billed. Target (issue 22): within 1% in every row.

    .venv/bin/python benchmarks/ledger_accuracy.py [--scenarios short,stopped,...]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def _ok(result) -> None:  # noqa: ANN001
    if not result.ok:
        raise SystemExit(f"`cloudtrain {' '.join(result.args)}` failed:\n{result.output}")


def _wait(condition: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit("timed out")
        time.sleep(0.2)


def short(cloud) -> None:  # noqa: ANN001
    _ok(cloud.run(cloud.recipe(run="echo ledger"), "--down"))


def stopped(cloud) -> None:  # noqa: ANN001
    _ok(cloud.up(cloud.recipe(run="echo ledger")))
    (instance,) = cloud.instances(cloud.cluster)
    launched = time.time()
    cloud.ec2().stop_instances(InstanceIds=[instance["InstanceId"]])
    _wait(lambda: time.time() > launched + 75, 120)


def reused(cloud) -> None:  # noqa: ANN001
    path = cloud.recipe(run="echo ledger")
    for _ in range(2):
        _ok(cloud.up(path))
        _ok(cloud.down())


def lost(cloud) -> None:  # noqa: ANN001
    gate = cloud.faults.hold("RunInstances", after=True)
    cloud.kill_cli_at(gate, "up", cloud.recipe(run="echo ledger"), "--cluster", cloud.cluster)
    _ok(cloud.cli("stop", cloud.cluster))


def deadline(cloud) -> None:  # noqa: ANN001
    gate = cloud.faults.hold("RunInstances", after=True)
    cloud.kill_cli_at(gate, "up", cloud.recipe(run="echo ledger", budget={"max_hours": 0.02}),
                      "--cluster", cloud.cluster)
    _wait(lambda: not cloud.bill.running(cloud.cluster), 200)


def hup(cloud) -> None:  # noqa: ANN001
    from cloudtrain.testing.faults import signal_cli_at

    gate = cloud.faults.hold("RunInstances", after=True)
    signal_cli_at(gate, ["up", str(cloud.recipe(run="echo ledger")), "--cluster", cloud.cluster],
                  {**os.environ, **cloud.env}, signal.SIGHUP)


SCENARIOS = {"short": short, "stopped": stopped, "reused": reused, "lost": lost, "deadline": deadline, "hup": hup}


def measure(names: list[str]) -> list[tuple[str, float, float]]:
    import pytest

    from cloudtrain.testing.aws import AwsCloud, MotoServer, isolate_aws_env
    from cloudtrain.testing.cloud import CloudMachines
    from cloudtrain.testing.sshd import SshdFactory

    rows = []
    with tempfile.TemporaryDirectory(prefix="ledger-bench-") as tmp:
        root = Path(tmp)
        server = MotoServer().start()
        factory = SshdFactory(root / "vms")
        try:
            with pytest.MonkeyPatch.context() as mp:
                isolate_aws_env(mp, root, server.env())
                for name in names:
                    server.faults.clear()  # a scenario's gates end with it
                    cloud = AwsCloud(root / name, mp, server, CloudMachines(factory), hint=name)
                    try:
                        SCENARIOS[name](cloud)
                        data = json.loads(cloud.cli("cost", "--json").stdout)
                        reported = sum(i["usd"] for i in data["incarnations"] if i["cluster"] == cloud.cluster)
                        rows.append((name, reported, cloud.bill.usd(cloud.cluster, until=data["at"])))
                    finally:
                        cloud.down()
                        cloud.close()
        finally:
            factory.close()
            server.stop()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    args = parser.parse_args()
    names = [n for n in args.scenarios.split(",") if n]
    unknown = set(names) - set(SCENARIOS)
    if unknown:
        raise SystemExit(f"unknown scenarios: {', '.join(sorted(unknown))} (known: {', '.join(SCENARIOS)})")
    rows = measure(names)
    print(f"{'scenario':<10} {'reported $':>12} {'billed $':>12} {'reported/billed':>16}")
    worst = 0.0
    for name, reported, billed in rows:
        ratio = reported / billed if billed else float("nan")
        worst = max(worst, abs(ratio - 1.0))
        print(f"{name:<10} {reported:>12.6f} {billed:>12.6f} {ratio:>16.4f}")
    print(f"worst deviation: {worst * 100:.2f}% (target: within 1%)")


if __name__ == "__main__":
    main()
