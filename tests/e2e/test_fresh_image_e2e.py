"""cloudtrain on a node that behaves like a fresh cloud image (cloudtrain.testing.rootfs): Debian 12's
own filesystem and distro Python, PEP 668, no pip, no rsync, no TensorFlow, none of this machine's
packages. The kit's sshd VMs share the test machine's Python and would hide all of that.

Offline: the node's pip points at a closed loopback port, so what needs an index fails there at once
(with pip's reason), and what a setup installs comes from the synced workdir.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cloudtrain.testing.cloud import SshCloud
from cloudtrain.testing.rootfs import FreshNode, fresh_node_factory, fresh_rootfs  # noqa: F401 - fixtures
from tests.test_bootstrap import _wheel


@pytest.fixture
def node(ssh_cloud: SshCloud, fresh_node_factory: list[FreshNode], fresh_rootfs: Path,  # noqa: F811
         tmp_path_factory: pytest.TempPathFactory) -> FreshNode:
    started = FreshNode(fresh_rootfs, tmp_path_factory.mktemp("fresh-node"),
                        [ssh_cloud.factory.client_key.public_openssh]).start()
    fresh_node_factory.append(started)
    return started


def hosts(cloud: SshCloud, node: FreshNode) -> dict:
    return {"cloud": "ssh", "hosts": [{"address": "127.0.0.1", "port": node.port, "user": node.user,
                                       "key": str(cloud.key)}]}


def test_setup_pip_installs_on_a_pep668_image_and_run_uses_it(ssh_cloud: SshCloud, node: FreshNode,
                                                             tmp_path: Path) -> None:
    workdir = tmp_path / "project"
    workdir.mkdir()
    shutil.copy(_wheel(tmp_path), workdir)
    recipe = ssh_cloud.recipe(workdir=str(workdir), resources=hosts(ssh_cloud, node),
                              setup="pip install --no-index ./ctprobe-1.0-py3-none-any.whl",
                              run="python -c 'import ctprobe, sys; print(ctprobe.VALUE, sys.version_info[:2], sys.prefix)'")
    result = ssh_cloud.run(recipe)
    assert result.ok, result.output
    assert "42 (3, 11) /home/ubuntu/.cloudtrain/venv" in result.stdout, result.output
    # Installed in the node's venv, not in its system Python (which refuses, PEP 668).
    assert not list((node.root / "usr" / "lib" / "python3").glob("**/ctprobe*"))


def test_a_failed_bootstrap_shows_pips_reason_and_keeps_the_log(ssh_cloud: SshCloud, node: FreshNode) -> None:
    recipe = ssh_cloud.recipe(resources=hosts(ssh_cloud, node),
                              job={"name": "mnist_cnn", "params": {"epochs": 1, "data": "bundled"}})
    result = ssh_cloud.run(recipe)
    assert not result.ok
    # pip's own words (the index refused the connection), not only "installing tensorflow-cpu failed".
    said = result.output
    assert "bootstrap failed (exit 4)" in said and "its last lines" in said and "  | " in said, said
    assert "No matching distribution found for tensorflow" in said, said
    log = node.root / "home" / "ubuntu" / ".cloudtrain" / "bootstrap.log"  # kept after `down`
    assert "installing tensorflow" in log.read_text() and "bootstrap.log on node 0" in said
    # ... and the whole log is in the run directory too.
    assert result.run_dir is not None and "installing tensorflow" in (result.run_dir / "bootstrap.log").read_text()
