"""A stopped cluster in `status --refresh` and `cost` (issue 39.3): what its disks cost per day and,
armed by autostop.delete_after_stopped_days, when `gc --expired` deletes it; with the kit's clock
(CLOUDTRAIN_NOW) past that, that it is due. On the AWS fake, stopped by the user (the days ride on
the launch request's tag; the stop time is EC2's own)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from cloudtrain.testing import sshd

if not sshd.sshd_available():
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def _cli(cloud, *args: str, at: float) -> subprocess.CompletedProcess:  # noqa: ANN001
    env = {**os.environ, **cloud.env, "CLOUDTRAIN_NOW": str(at)}
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], cwd=str(cloud.root), env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_status_refresh_and_cost_say_what_a_stopped_cluster_costs_and_when_it_goes(aws_cloud) -> None:  # noqa: ANN001
    recipe = aws_cloud.recipe(run="true", autostop={"idle_minutes": 30, "delete_after_stopped_days": 7})
    up = aws_cloud.up(recipe)
    assert up.ok, up.output
    try:
        stop = aws_cloud.cli("stop", aws_cloud.cluster)
        assert stop.ok, stop.output

        now = time.time()
        status = _cli(aws_cloud, "status", "--refresh", at=now)
        assert status.returncode == 0, status.stdout + status.stderr
        line = next(l for l in status.stdout.splitlines() if l.startswith(f"{aws_cloud.cluster}: "))
        assert "its disks cost about $" in line and "/day" in line, line
        assert "`cloudtrain gc --expired --yes` deletes it from" in line and "(7.0 days" in line, line

        later = _cli(aws_cloud, "status", "--refresh", at=now + 8 * 86400)
        line = next(l for l in later.stdout.splitlines() if l.startswith(f"{aws_cloud.cluster}: "))
        assert "due for deletion" in line and "gc --expired --yes" in line, line

        cost = _cli(aws_cloud, "cost", at=now)
        assert cost.returncode == 0, cost.stdout + cost.stderr
        said = [l for l in cost.stdout.splitlines() if l.startswith(f"{aws_cloud.cluster} is stopped: ")]
        assert len(said) == 1 and "its disks cost about $" in said[0] and "/day" in said[0], cost.stdout
    finally:
        down = aws_cloud.down()
        assert down.ok, down.output
    assert aws_cloud.leftovers() == []
