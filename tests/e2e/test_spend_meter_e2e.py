"""One number per run (issue 35.11): the phase lines' `$X spent` of a run on a reused cluster name
count this run's incarnation only, never the previous, already deleted one; the last meter equals
the run's cost in run.json."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def test_the_meter_of_a_second_incarnation_counts_only_its_own_spend(aws_cloud: AwsCloud) -> None:
    recipe = aws_cloud.recipe(run="echo hi")
    first = aws_cloud.run(recipe)
    assert first.ok, first.output
    second = aws_cloud.run(recipe)
    assert second.ok, second.output
    meters = [float(m) for m in re.findall(r"\$([0-9.]+) spent", second.stdout)]
    assert meters, second.stdout
    run = json.loads((Path(second.stdout.strip().splitlines()[-1]) / "run.json").read_text())
    assert run["cost_usd"] > 0
    # Every meter of the second run stays within its own spend (the first incarnation's minimum
    # is as large: counting it would at least double the number).
    assert max(meters) == pytest.approx(run["cost_usd"], abs=0.0001), (meters, run["cost_usd"])
