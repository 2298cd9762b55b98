"""The ledger against the fake's own bill at its edges: stops the cloud made with no cloudtrain
command seeing them. EC2 stopping two instances on its own (the watchdog's stop, the console's)
before our own `stop` or `down`, and, in the same minute, two VMs whose `up` was SIGKILLed between
EC2's create and its answer and that ended at the deadline their launch request carried: one
stopped (a budget), one terminated before anyone looked (autostop down; EC2 still describes a
terminated instance for about an hour, so its life is observed, not estimated).

`cost --json` must equal the fake's bill (cloudtrain/testing/bill.py) within 1%; it used to bill the
machine until the later command (1.61x after `stop`, 4.8x after `down`). EC2 bills each start at
least a minute and moto has no clock to move: the scenarios share one real minute of waiting.
"""

from __future__ import annotations

import json
import os
import time

import pytest

from cloudtrain.providers.deadline import GRACE_ENV
from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

MINIMUM_S = 60  # EC2's minimum billed compute per start
T3_MEDIUM_HOURLY = 0.0416
# Past the minimum by more than the tolerance below: billed until our command, compute would show.
MARGIN_S = 8
BUDGET_S = 12  # the dead CLIs' budget as running seconds: their launch requests' deadline (+ its grace)


def assert_ledger_is_the_bill(cloud: AwsCloud, *clusters: str) -> dict:
    """cost --json (every incarnation of each cluster) against the fake's bill at the same moment,
    as tests/e2e/test_ledger_e2e.py: within 1%, or 2 s of the instance's price (EC2 reports its
    transition times in whole seconds)."""
    result = cloud.cli("cost", "--json")
    assert result.returncode == 0, result.output
    data = json.loads(result.stdout)
    reported = {c: sum(i["usd"] for i in data["incarnations"] if i["cluster"] == c) for c in clusters}
    billed = {c: cloud.bill.usd(c, until=data["at"]) for c in clusters}
    assert all(billed.values()), f"the fake billed nothing for some of {billed}"
    assert reported == {c: pytest.approx(b, rel=0.01, abs=2 * T3_MEDIUM_HOURLY / 3600) for c, b in billed.items()}, data
    return data


def _kill_up_during_create(cloud: AwsCloud, cluster: str, **fields: object) -> None:
    """`up` SIGKILLed once EC2 has made the VM and before the CLI hears of it: the VM has only the
    deadline its launch request carries (user data run by cloud-init), no watchdog."""
    gate = cloud.faults.hold("RunInstances", after=True, when=lambda r: cluster in r.params.values())
    cloud.kill_cli_at(gate, "up", cloud.recipe(run="echo ledger", budget={"max_hours": BUDGET_S / 3600}, **fields),
                      "--cluster", cluster)
    (instance,) = cloud.instances(cluster)
    assert instance["State"]["Name"] in ("pending", "running"), (cluster, instance["State"])


def test_the_clouds_own_stops_are_billed_from_when_they_happened(aws_cloud: AwsCloud) -> None:
    """`kept` and `ended`: stopped by EC2 on its own right after `up`; a minute later `cost` bills
    compute until that stop, then one gets `stop` and the other `down`. Neither is billed compute
    past EC2's stop (its minimum aside), and the stopped one, started again, is billed from its start.
    `stopped` and `gone`: their CLI died during boot; each still ends at its deadline (a budget
    stops; with autostop down the deadline terminates) and the ledger is then exactly its life."""
    kept, ended = aws_cloud.cluster, aws_cloud.new_cluster()
    stopped, gone = aws_cloud.new_cluster(), aws_cloud.new_cluster()
    path = aws_cloud.recipe(run="echo ledger")
    for name in (kept, ended):
        up = aws_cloud.up(path, cluster=name)
        assert up.ok, up.output
    instances = {name: aws_cloud.instances(name)[0] for name in (kept, ended)}
    # The cloud acts on its own (the watchdog's stop, the console's): no cloudtrain command sees it.
    aws_cloud.ec2().stop_instances(InstanceIds=[i["InstanceId"] for i in instances.values()])
    assert aws_cloud.bill.running(kept) == [] and aws_cloud.bill.running(ended) == []

    # Within the minute: the dead CLIs' VMs, the real backstop in seconds (the grace shortened, a
    # test override).
    aws_cloud.env[GRACE_ENV] = "3"
    _kill_up_during_create(aws_cloud, stopped)
    _kill_up_during_create(aws_cloud, gone, autostop={"idle_minutes": 30, "down": True})
    wait_until(lambda: not aws_cloud.bill.running(stopped) and not aws_cloud.bill.running(gone), BUDGET_S + 120,
               "the VMs' own deadlines")
    (instance,) = aws_cloud.instances(stopped)
    assert instance["State"]["Name"] == "stopped"  # a budget stops (autostop.down would delete)
    assert aws_cloud.bill.lifetimes(stopped)[instance["InstanceId"]] >= BUDGET_S
    (instance,) = aws_cloud.instances(gone)
    assert instance["State"]["Name"] == "terminated"

    # EC2 bills each start at least a minute: only a command later than that shows a wrong stop
    # time. moto has no clock to move, so the wait is real.
    last_launch = max(i["LaunchTime"].timestamp() for i in instances.values())
    wait_until(lambda: time.time() > last_launch + MINIMUM_S + MARGIN_S, MINIMUM_S + 60, "a minute past the launch")
    # The first command after the cloud's stops: `cost` counts compute until each stop, not until now.
    data = assert_ledger_is_the_bill(aws_cloud, kept, ended, stopped, gone)
    status = json.loads(aws_cloud.cli("status", kept, "--json").stdout)["clusters"][0]
    assert status["status"] == "stopped"
    # The VM deleted before anyone looked: its life as EC2 still reports it, observed, not estimated;
    # settled: the intent is over, nothing of it is looked for again, and down has nothing to end.
    reported = [i for i in data["incarnations"] if i["cluster"] == gone]
    assert [i["estimated_usd"] for i in reported] == [0.0], data
    assert [i["billing_now"] for i in reported] == [False], data
    (cluster,) = [c for c in data["clusters"] if c["cluster"] == gone]
    assert cluster["status"] == "terminated", cluster

    result = aws_cloud.cli("stop", kept)
    assert result.ok, result.output
    assert aws_cloud.down(ended).ok
    assert_ledger_is_the_bill(aws_cloud, kept, ended)
    # A later start bills only from the start.
    started = aws_cloud.cli("start", kept)
    assert started.ok, started.output
    assert_ledger_is_the_bill(aws_cloud, kept)
    assert aws_cloud.down(kept).ok
    assert aws_cloud.down(stopped).ok
    # The terminated VM's key pair and security group are the cluster's until its `down`.
    assert aws_cloud.down(gone).ok
    assert aws_cloud.bill.running() == []
    assert_ledger_is_the_bill(aws_cloud, kept, stopped)
    assert aws_cloud.leftovers() == []
