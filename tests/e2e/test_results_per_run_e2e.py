"""A run collects only what its own job wrote (issue 23.3). The workdir on a node is shared by
every run of its cluster and sync never deletes, so an earlier run's results are still there:
a second run whose job writes nothing must collect nothing, and one that writes a new file gets
that file alone, on this machine and over SSH alike."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from cloudtrain.testing.cloud import FakeCloud


@pytest.mark.parametrize("name", ["local", "ssh"])
def test_a_run_collects_only_what_its_job_wrote(fake_cloud: Callable[[str], FakeCloud], name: str) -> None:
    cloud = fake_cloud(name)
    first = cloud.run(cloud.recipe(run="mkdir -p outputs && echo one > outputs/first.txt", results=["outputs"]),
                      "--keep")
    assert first.ok, first.output
    assert (first.run_dir / "outputs" / "first.txt").read_text() == "one\n"

    nothing = cloud.run(cloud.recipe(run="echo wrote nothing", results=["outputs"]), "--keep")
    assert nothing.ok, nothing.output
    assert not (nothing.run_dir / "outputs").exists(), list(nothing.run_dir.rglob("*"))
    assert [r for r in nothing.run_json["results"] if r.startswith("outputs")] == []

    second = cloud.run(cloud.recipe(run="echo two > outputs/second.txt", results=["outputs"]))
    assert second.ok, second.output
    assert sorted(p.name for p in (second.run_dir / "outputs").iterdir()) == ["second.txt"]
    assert [r for r in second.run_json["results"] if r.startswith("outputs")] == ["outputs/second.txt"]
