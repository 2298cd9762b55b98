"""`up` runs the recipe's setup (issue 35.4: `up` then `exec -- python train.py` failed with
ModuleNotFoundError), once per node and setup text; `exec` on a node whose setup never ran runs it
first."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.cloud import FakeCloud


def _setup(counter: Path) -> str:
    # What a `pip install` would do: something the job imports, and a count of how often it ran.
    return f"echo ran >> {counter}; mkdir -p lib && echo 'VALUE = 42' > lib/helper.py"


@pytest.mark.parametrize("cloud", ["local", "ssh"])
def test_up_runs_setup_once_and_exec_finds_it_done(fake_cloud, cloud: str, tmp_path: Path) -> None:  # noqa: ANN001
    if cloud == "ssh" and not sshd.sshd_available() and not os.environ.get("CI"):
        pytest.skip("OpenSSH sshd is not installed")
    fc: FakeCloud = fake_cloud(cloud)
    counter = tmp_path / "setup-count"
    recipe = fc.recipe(setup=_setup(counter), run="true")
    first = fc.up(recipe)
    assert first.ok, first.output
    assert "==> setup" in first.stdout and counter.read_text() == "ran\n"
    used = fc.cli("exec", fc.cluster, "--", "sh", "-c", "PYTHONPATH=lib python3 -c 'import helper; print(helper.VALUE)'")
    assert used.ok and "42" in used.stdout, used.output
    again = fc.up(recipe)
    assert again.ok and "==> setup" not in again.stdout, again.output
    assert counter.read_text() == "ran\n"  # once per node and setup text
    recipe = fc.recipe(setup=_setup(counter) + "; echo changed", run="true")
    changed = fc.up(recipe)
    assert changed.ok and counter.read_text() == "ran\nran\n", changed.output
    assert fc.down().ok


def test_exec_on_a_node_whose_setup_never_ran_runs_it_first(local_cloud: FakeCloud, tmp_path: Path) -> None:
    counter = tmp_path / "setup-count"
    plain = local_cloud.recipe(run="true")
    assert local_cloud.up(plain).ok
    # The recipe the cluster was made from gains a setup afterwards (the user added a requirement).
    with_setup = local_cloud.recipe(setup=_setup(counter), run="true")
    assert with_setup == plain
    ran = local_cloud.cli("exec", local_cloud.cluster, "--", "sh", "-c", "cat lib/helper.py")
    assert ran.ok and "VALUE = 42" in ran.stdout and "==> setup" in ran.stdout, ran.output
    twice = local_cloud.cli("exec", local_cloud.cluster, "--", "true")
    assert twice.ok and "==> setup" not in twice.stdout and counter.read_text() == "ran\n", twice.output
    assert local_cloud.down().ok


@pytest.mark.skipif(not sshd.sshd_available() and not os.environ.get("CI"), reason="OpenSSH sshd is not installed")
def test_up_after_down_sets_up_again_a_host_down_cleaned(ssh_cloud: FakeCloud, tmp_path: Path) -> None:
    # `down` removes cloudtrain's files from your own host (the setup's work and its mark with
    # them); the host and its name come back the same, so what this machine remembers of it is stale.
    counter = tmp_path / "setup-count"
    recipe = ssh_cloud.recipe(setup=_setup(counter), run="true")
    assert ssh_cloud.up(recipe).ok and counter.read_text() == "ran\n"
    assert ssh_cloud.down().ok
    again = ssh_cloud.up(recipe)
    assert again.ok and "==> setup" in again.stdout and counter.read_text() == "ran\nran\n", again.output
    used = ssh_cloud.cli("exec", ssh_cloud.cluster, "--", "cat", "lib/helper.py")
    assert used.ok and "VALUE = 42" in used.stdout, used.output
    assert ssh_cloud.down().ok


def test_up_and_exec_help_say_they_run_setup(local_cloud: FakeCloud) -> None:
    up_help, exec_help = local_cloud.cli("up", "--help"), local_cloud.cli("exec", "--help")
    assert up_help.ok and exec_help.ok, up_help.output + exec_help.output
    assert "run its `setup` on every node where that setup has not run yet" in " ".join(up_help.stdout.split())
    assert "`setup` of the recipe the cluster was made from never ran" in " ".join(exec_help.stdout.split())


def test_a_setup_whose_envs_changed_runs_again(local_cloud: FakeCloud, tmp_path: Path) -> None:
    # The setup installs what envs pins (`pip install torch==$TORCH`): a new pin is a new setup.
    counter = tmp_path / "setup-count"
    setup = f"echo $PIN >> {counter}"
    assert local_cloud.up(local_cloud.recipe(setup=setup, run="true", envs={"PIN": "1"})).ok
    same = local_cloud.up(local_cloud.recipe(setup=setup, run="true", envs={"PIN": "1"}))
    assert same.ok and "==> setup" not in same.stdout, same.output
    pinned = local_cloud.up(local_cloud.recipe(setup=setup, run="true", envs={"PIN": "2"}))
    assert pinned.ok and "==> setup" in pinned.stdout, pinned.output
    assert counter.read_text() == "1\n2\n"
    assert local_cloud.down().ok
