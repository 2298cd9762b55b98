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
