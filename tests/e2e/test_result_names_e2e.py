"""A result name with a newline comes home verified (issue 29, case 3), over ssh and on AWS spot.

The node's file listing was parsed line by line, so a job writing `outputs/a<newline>b` made every
`run` and `collect` report "did not arrive whole", exit 1, and keep the node (a spot VM running).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

from cloudtrain.testing.sshd import SshdFactory
from tests.conftest import cli_env, cloudtrain
from tests.e2e.test_aws_e2e import REGION, assert_nothing_left, cloud, instances  # noqa: F401 (cloud: fixture)

JOB = """\
rm -rf outputs && mkdir -p outputs
printf 'one' > "$(printf 'outputs/a\\nb')"
printf 'two' > 'outputs/plain.txt'
echo wrote results
"""
NAMES = {"a\nb": b"one", "plain.txt": b"two"}


def _assert_results_home(proc: subprocess.CompletedProcess) -> Path:
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "did not arrive whole" not in proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert {p.name: p.read_bytes() for p in (run_dir / "outputs").iterdir()} == NAMES
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    return run_dir


def test_newline_in_a_result_name_over_ssh(sshd_vm_factory: SshdFactory, tmp_path: Path) -> None:
    vm = sshd_vm_factory.start()
    recipe = tmp_path / "nl-ssh.yaml"
    recipe.write_text(textwrap.dedent(f"""\
        name: nl-ssh
        resources:
          cloud: ssh
          hosts: [{{address: {vm.host}, port: {vm.port}, user: {vm.user}, key: "{sshd_vm_factory.client_key.private_path}"}}]
        results: [outputs]
        run: |
    """) + textwrap.indent(JOB, "          "))
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "run", str(recipe), "--runs-dir", str(tmp_path / "runs")],
                          capture_output=True, text=True, timeout=600, env=cli_env(), cwd=tmp_path)
    _assert_results_home(proc)
    assert not (vm.home_dir / ".cloudtrain" / "nl-ssh").exists()  # collected, so our files were removed


def test_newline_in_a_result_name_on_aws_spot(tmp_path: Path, cloud: dict[str, Any]) -> None:  # noqa: F811
    recipe = tmp_path / "nl-spot.yaml"
    recipe.write_text(
        "name: nl-spot\n"
        f"resources: {{cloud: aws, region: {REGION}, instance_type: t3.medium, image: {cloud['ami']}, spot: true}}\n"
        "results: [outputs]\nrun: |\n" + textwrap.indent(JOB, "  ")
    )
    proc = cloudtrain("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    _assert_results_home(proc)
    (launched,) = instances(cloud["ec2"], "nl-spot")
    assert launched.get("InstanceLifecycle") == "spot"
    assert launched["State"]["Name"] == "terminated"  # verified, so nothing was kept running
    assert_nothing_left(cloud["ec2"], "nl-spot")
