"""Price before launch: `run` and `up` on a priced cloud ask before anything starts billing.

Against moto with sshd VMs (the aws_cloud kit), with the config's `confirm` back at its default
(the kit turns it off): without a terminal nothing is launched unless `--yes`; on a terminal (a
pty as stdin) the price and the worst case are shown and the answer decides. A cluster that is
already up asks nothing (the edit-run loop); a stopped one asks before it is started again.
"""

from __future__ import annotations

import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.cloud import CliResult


@pytest.fixture
def cloud(aws_cloud: AwsCloud) -> AwsCloud:
    aws_cloud.configure(confirm=True)  # a user's default
    return aws_cloud


def live_instances(cloud: AwsCloud) -> list:
    return [i for i in cloud.instances(cloud.cluster) if i["State"]["Name"] not in ("terminated", "shutting-down")]


def on_a_terminal(cloud: AwsCloud, answer: str, *args: str) -> CliResult:
    """`cloudtrain ARGS` with a pty as stdin (so it may ask), `answer` typed at the prompt."""
    master, slave = pty.openpty()
    env = {**os.environ, **cloud.env}
    try:
        proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", *args], cwd=cloud.root, env=env, stdin=slave,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        os.close(slave)
        slave = -1
        os.write(master, answer.encode() + b"\n")
        stdout, stderr = proc.communicate(timeout=600)
    finally:
        if slave >= 0:
            os.close(slave)
        os.close(master)
    return CliResult(args, proc.returncode, stdout, stderr)


def test_without_a_terminal_nothing_launches_unless_yes(cloud: AwsCloud, tmp_path: Path) -> None:
    recipe = cloud.recipe(run="echo hi", budget={"max_hours": 2})
    refused = cloud.run(recipe)
    assert refused.returncode == 2, refused.output
    (line,) = [ln for ln in refused.stderr.splitlines() if ln.strip()]
    assert "launch new cluster" in line and "$" in line and "--yes" in line and "confirm: false" in line
    assert "Traceback" not in refused.output
    assert live_instances(cloud) == [] and cloud.leftovers() == []
    assert not cloud.runs_dir.exists() or not any(cloud.runs_dir.iterdir())  # not even a run directory

    ran = cloud.run(recipe, "--yes")
    assert ran.ok, ran.output
    assert "hi" in ran.output
    assert live_instances(cloud) == [] and cloud.leftovers() == []  # the run created it and took it down


def test_on_a_terminal_the_price_is_shown_and_no_means_nothing_launched(cloud: AwsCloud) -> None:
    recipe = cloud.recipe(run="echo hi", budget={"max_usd": 1.5})
    declined = on_a_terminal(cloud, "n", "up", str(recipe), "--cluster", cloud.cluster)
    assert declined.returncode == 1, declined.output
    shown = declined.stdout + declined.stderr
    assert "t3.medium" in shown and "$0.0416/h" in shown  # the catalog's price
    assert "at most $1.50 (budget $1.5, enforced on the machine)" in shown
    assert "proceed?" in shown and "nothing launched: you answered no" in shown
    assert live_instances(cloud) == [] and cloud.leftovers() == []

    accepted = on_a_terminal(cloud, "y", "up", str(recipe), "--cluster", cloud.cluster)
    assert accepted.returncode == 0, accepted.output
    assert len(live_instances(cloud)) == 1

    # Already up: a warm run starts no new billing and asks nothing, terminal or not.
    warm = cloud.run(recipe)
    assert warm.ok, warm.output
    assert "proceed?" not in warm.output

    # Stopped: starting it again bills again, so it asks; without a terminal it is refused.
    assert cloud.cli("stop", cloud.cluster).ok
    refused = cloud.run(recipe)
    assert refused.returncode == 2 and "start stopped cluster" in refused.stderr, refused.output
    assert [i["State"]["Name"] for i in live_instances(cloud)] == ["stopped"]
    started = cloud.run(recipe, "-y")
    assert started.ok, started.output

    down = cloud.down()
    assert down.ok, down.output
    assert cloud.leftovers() == []


def test_config_confirm_false_never_asks(cloud: AwsCloud) -> None:
    cloud.configure(confirm=False)
    up = cloud.up(cloud.recipe(run="echo hi"))
    assert up.ok, up.output
    assert "plan: t3.medium" in up.output  # the price is still printed
    assert cloud.down().ok
    assert cloud.leftovers() == []
