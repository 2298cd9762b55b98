"""`down NAME` for a name this machine's state does not hold (issues 35.3 and 34.7): the clouds are
asked by tag before anything is said; a typo is an error with the near name, never a success; a
name that was here and is gone stays an idempotent success."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.cloud import FakeCloud


def test_down_of_a_typo_fails_with_the_near_name_and_leaves_the_cluster_up(local_cloud: FakeCloud) -> None:
    assert local_cloud.up(local_cloud.recipe(run="true")).ok
    typo = local_cloud.cluster[:-1]
    down = local_cloud.cli("down", typo)
    assert down.returncode == 2, down.stdout + down.stderr
    assert f"no cluster named {typo!r}" in down.stderr and f"did you mean {local_cloud.cluster!r}?" in down.stderr
    assert "nothing to do" not in down.stdout and "is down" not in down.stdout
    clusters = json.loads(local_cloud.cli("status", "--json").stdout)["clusters"]
    assert [c["name"] for c in clusters] == [local_cloud.cluster]


def test_down_of_a_cluster_already_down_is_an_idempotent_success(local_cloud: FakeCloud) -> None:
    assert local_cloud.up(local_cloud.recipe(run="true")).ok
    assert local_cloud.down().ok
    again = local_cloud.cli("down", local_cloud.cluster)
    assert again.returncode == 0 and "already down" in again.stdout, again.stdout + again.stderr


def test_down_after_the_state_was_lost_ends_this_machine_nodes_by_tag(local_cloud: FakeCloud) -> None:
    assert local_cloud.up(local_cloud.recipe(run="true")).ok
    for db in local_cloud.home.glob("state.db*"):
        db.unlink()
    down = local_cloud.cli("down", local_cloud.cluster)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "found by tag" in down.stdout
    assert local_cloud.leftovers() == []


@pytest.mark.skipif(not sshd.sshd_available() and not os.environ.get("CI"), reason="OpenSSH sshd is not installed")
def test_down_from_another_state_terminates_the_vm_by_tag(aws_cloud: FakeCloud, tmp_path: Path) -> None:
    """The VM was made under one CLOUDTRAIN_HOME; `down` runs under another (a lost database, a
    second machine of the same owner): it finds the VM by its tag and, once told that a VM marked
    alive moments ago is meant, terminates it."""
    assert aws_cloud.up(aws_cloud.recipe(run="true")).ok
    assert aws_cloud.bill.running(aws_cloud.cluster)  # type: ignore[attr-defined]
    other = {**aws_cloud.env, "CLOUDTRAIN_HOME": str(tmp_path / "other-home")}
    import subprocess
    import sys

    def down(*flags: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "cloudtrain", "down", aws_cloud.cluster, *flags],
                              env={**os.environ, **other}, capture_output=True, text=True, timeout=300, check=False)

    # Just launched, its liveness mark is fresh: it may be another state's live run (34.1).
    held = down()
    assert held.returncode == 2 and "in use elsewhere" in held.stderr and "--include-live" in held.stderr, held.stderr
    assert aws_cloud.bill.running(aws_cloud.cluster)  # type: ignore[attr-defined]
    down = down("--include-live")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "terminated on aws (found by tag)" in down.stdout
    assert aws_cloud.bill.running(aws_cloud.cluster) == []  # type: ignore[attr-defined]
