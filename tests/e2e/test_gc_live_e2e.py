"""`gc --yes` never ends live work it does not know (issue 34.1). A run under one CLOUDTRAIN_HOME;
`gc --yes` from another of the same owner (a second laptop, a CI runner logged in as the same
user), while setup runs and while the job runs: the machine carries a fresh liveness mark, gc
shows it as in use elsewhere and leaves it alone, and the run succeeds. Once nobody has marked it
for long, it is a leak like any other."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

SETUP = 'touch "$HOME/setup-started"; while [ ! -e "$HOME/go-setup" ]; do sleep 0.1; done'
JOB = ('touch "$HOME/job-started"; while [ ! -e "$HOME/go-job" ]; do sleep 0.1; done; '
       'mkdir -p outputs; echo done > outputs/result.txt')


def _on_vm(cloud: AwsCloud, name: str) -> Path | None:
    for instance in cloud.instances(cloud.cluster):
        if instance["InstanceId"] in cloud.machines:
            return cloud.machines.vm(instance["InstanceId"]).home_dir / name
    return None


def _exists_on_vm(cloud: AwsCloud, name: str) -> bool:
    path = _on_vm(cloud, name)
    return path is not None and path.exists()


def _elsewhere(cloud: AwsCloud, home: Path, *args: str) -> subprocess.CompletedProcess:
    """`cloudtrain ARGS` under another CLOUDTRAIN_HOME with the same config and owner."""
    env = {**os.environ, **cloud.env, "CLOUDTRAIN_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "cloudtrain", *args], env=env, capture_output=True, text=True,
                          timeout=300, check=False)


def test_gc_yes_from_another_state_leaves_a_live_run_alone(aws_cloud: AwsCloud, tmp_path: Path) -> None:
    recipe = aws_cloud.recipe(setup=SETUP, run=JOB, results=["outputs"])
    run = subprocess.Popen([sys.executable, "-m", "cloudtrain", "run", str(recipe), "--cluster", aws_cloud.cluster,
                            "--runs-dir", str(aws_cloud.runs_dir)], env={**os.environ, **aws_cloud.env},
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    other = tmp_path / "other-home"
    try:
        for phase, gate in (("setup", "go-setup"), ("job", "go-job")):
            wait_until(lambda: _exists_on_vm(aws_cloud, f"{phase}-started"), 300, f"the run's {phase} to start")
            gc = _elsewhere(aws_cloud, other, "gc", "--cloud", "aws", "--yes")
            assert f"in use elsewhere, left alone: aws {aws_cloud.cluster}" in gc.stdout, gc.stdout + gc.stderr
            assert "alive" in gc.stdout and "terminated" not in gc.stdout
            down = _elsewhere(aws_cloud, other, "down", aws_cloud.cluster)
            assert down.returncode == 2 and "in use elsewhere" in down.stderr, down.stdout + down.stderr
            assert aws_cloud.bill.running(aws_cloud.cluster)
            path = _on_vm(aws_cloud, gate)
            assert path is not None
            path.touch()
        out, err = run.communicate(timeout=300)
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate()
    assert run.returncode == 0, out + err
    run_dir = Path(out.strip().splitlines()[-1])
    assert (run_dir / "outputs" / "result.txt").read_text() == "done\n"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    assert aws_cloud.leftovers() == []


def test_a_held_cluster_renews_its_mark_and_an_old_mark_is_a_leak(aws_cloud: AwsCloud, tmp_path: Path) -> None:
    from cloudtrain.cluster.liveness import LIVE_FOR_S, AliveMarks
    from cloudtrain.config import load_config
    from cloudtrain.providers import get_provider

    assert aws_cloud.up(aws_cloud.recipe(run="true")).ok
    provider = get_provider("aws", load_config())
    ids = [i.id for i in provider.list_tagged(aws_cloud.cluster)]
    provider.mark_alive(ids, time.time() - 3 * LIVE_FOR_S)  # nobody held it for an hour
    other = tmp_path / "other-home"
    listed = json.loads(_elsewhere(aws_cloud, other, "gc", "--cloud", "aws", "--json").stdout)
    (leak,) = [leak for leak in listed["leaks"] if leak["cluster"] == aws_cloud.cluster and leak["kind"] == "instance"]
    assert leak["evidence"] == "last alive 1.0 h ago" and not leak["live"]

    # A command holding the cluster marks its machines once it has lasted, then every `every_s`.
    with AliveMarks(None, load_config(), aws_cloud.cluster, every_s=0.5, look_every_s=0.1, first_after_s=0.1):
        wait_until(lambda: all(i.alive_at and time.time() - i.alive_at < 5 for i in provider.list_tagged(aws_cloud.cluster)),
                   60, "the holder's mark")
        first = max(i.alive_at or 0 for i in provider.list_tagged(aws_cloud.cluster))
        wait_until(lambda: max(i.alive_at or 0 for i in provider.list_tagged(aws_cloud.cluster)) > first, 60,
                   "the mark to be renewed")
    held = json.loads(_elsewhere(aws_cloud, other, "gc", "--cloud", "aws", "--json").stdout)
    assert aws_cloud.cluster in {leak["cluster"] for leak in held["live"]}

    # Not marked for long: a leak, and `--yes` removes it.
    provider.mark_alive(ids, time.time() - 3 * LIVE_FOR_S)
    removed = _elsewhere(aws_cloud, other, "gc", "--cloud", "aws", "--yes")
    assert f"aws: terminated {', '.join(sorted(ids))} ({aws_cloud.cluster})" in removed.stdout, removed.stdout
    assert aws_cloud.bill.running(aws_cloud.cluster) == []
