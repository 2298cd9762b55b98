"""The ledger against the fake's own bill at its edges: a stop the cloud made before our own
`stop` or `down` (the watchdog's, here EC2 stopping the instance on its own as the console would).

`cost --json` must equal the fake's bill (cloudtrain/testing/bill.py) within 1%; it used to bill the
machine until the later command (1.61x after `stop`, 4.8x after `down`).
"""

from __future__ import annotations

import json
import os
import time

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

MINIMUM_S = 60  # EC2's minimum billed compute per start
T3_MEDIUM_HOURLY = 0.0416
# Past the minimum by more than the tolerance below: billed until our command, compute would show.
MARGIN_S = 8


def assert_ledger_is_the_bill(cloud: AwsCloud, *clusters: str) -> None:
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


def test_a_stop_or_down_after_the_clouds_own_stop_bills_until_that_stop(aws_cloud: AwsCloud) -> None:
    """Two clusters, stopped by EC2 on its own right after `up`; a minute later `cost` bills compute
    until that stop, then one gets `stop` and the other `down`. Neither is billed compute past EC2's
    stop (its minimum aside), and the stopped one, started again, is billed from its start."""
    kept, ended = aws_cloud.cluster, aws_cloud.new_cluster()
    path = aws_cloud.recipe(run="echo ledger")
    for name in (kept, ended):
        up = aws_cloud.up(path, cluster=name)
        assert up.ok, up.output
    instances = {name: aws_cloud.instances(name)[0] for name in (kept, ended)}
    # The cloud acts on its own (the watchdog's stop, the console's): no cloudtrain command sees it.
    aws_cloud.ec2().stop_instances(InstanceIds=[i["InstanceId"] for i in instances.values()])
    assert aws_cloud.bill.running(kept) == [] and aws_cloud.bill.running(ended) == []
    # EC2 bills each start at least a minute: only a command later than that shows a wrong stop
    # time. moto has no clock to move, so the wait is real.
    last_launch = max(i["LaunchTime"].timestamp() for i in instances.values())
    wait_until(lambda: time.time() > last_launch + MINIMUM_S + MARGIN_S, MINIMUM_S + 60, "a minute past the launch")
    # The first command after the cloud's stop: `cost` counts compute until that stop, not until now.
    assert_ledger_is_the_bill(aws_cloud, kept, ended)
    status = json.loads(aws_cloud.cli("status", kept, "--json").stdout)["clusters"][0]
    assert status["status"] == "stopped"

    stopped = aws_cloud.cli("stop", kept)
    assert stopped.ok, stopped.output
    assert aws_cloud.down(ended).ok
    assert_ledger_is_the_bill(aws_cloud, kept, ended)
    # A later start bills only from the start.
    started = aws_cloud.cli("start", kept)
    assert started.ok, started.output
    assert_ledger_is_the_bill(aws_cloud, kept)
    assert aws_cloud.down(kept).ok
    assert aws_cloud.bill.running() == []
    assert_ledger_is_the_bill(aws_cloud, kept)
