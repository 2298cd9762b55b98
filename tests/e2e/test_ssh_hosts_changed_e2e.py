"""A failed `ssh` cluster never pins its old hosts (issue 35.5): a run with a mistyped host fails,
leaves no `down-failed` record for a node it never reached, and the corrected recipe runs on the
corrected host; a cluster whose recipe hosts changed is re-made from the recipe."""

from __future__ import annotations

import json
import os
import socket

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.cloud import SshCloud

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_mistyped_host_then_the_corrected_recipe_runs(ssh_cloud: SshCloud) -> None:
    ssh_cloud.configure(ssh={"connect_retries_s": 2})
    good = ssh_cloud.recipe_resources()
    typo = {**good, "hosts": [{**good["hosts"][0], "port": _closed_port()}]}
    failed = ssh_cloud.run(ssh_cloud.recipe(run="echo hi", resources=typo))
    assert failed.returncode != 0, failed.output
    clusters = json.loads(ssh_cloud.cli("status", "--json").stdout)["clusters"]
    assert clusters == [], clusters  # never reached: nothing of ours there, nothing to keep in state
    fixed = ssh_cloud.run(ssh_cloud.recipe(run="echo hi from the right host", resources=good))
    assert fixed.ok, fixed.output
    assert "hi from the right host" in fixed.stdout
    assert ssh_cloud.leftovers() == []


def test_a_kept_cluster_whose_recipe_hosts_changed_is_remade(ssh_cloud: SshCloud) -> None:
    first = ssh_cloud.run(ssh_cloud.recipe(run="echo one"), "--keep")
    assert first.ok, first.output
    old = ssh_cloud.vms[0]
    new = ssh_cloud.add_vm()
    moved = {**ssh_cloud.recipe_resources(), "hosts": [{"address": new.host, "port": new.port, "user": new.user,
                                                          "key": str(ssh_cloud.key)}]}
    second = ssh_cloud.run(ssh_cloud.recipe(run="echo two", resources=moved))
    assert second.ok, second.output
    assert "two" in second.stdout
    assert "hosts changed" in second.output
    # The old host's files went with the old cluster; the new one's with the run's teardown.
    assert not (old.home_dir / ".cloudtrain" / "clusters").exists() or not any(
        (old.home_dir / ".cloudtrain" / "clusters").iterdir())
    assert ssh_cloud.leftovers() == []
