"""The multi-node conventions, table-driven: what each rank is told."""

from __future__ import annotations

import subprocess

import pytest

from cloudtrain.run.multinode import conventions, hostfile_prelude, hostfile_text


@pytest.mark.parametrize("ips,rank,gpus,expected", [
    (["10.0.0.1"], 0, 0, {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "1", "NODE_RANK": "0", "NNODES": "1",
                          "NPROC_PER_NODE": "1"}),
    (["10.0.0.1", "10.0.0.2"], 1, 0, {"MASTER_ADDR": "10.0.0.1", "WORLD_SIZE": "2", "NODE_RANK": "1", "NNODES": "2",
                                      "NPROC_PER_NODE": "1"}),
    (["a", "b"], 0, 8, {"MASTER_ADDR": "a", "WORLD_SIZE": "16", "NODE_RANK": "0", "NNODES": "2",
                        "NPROC_PER_NODE": "8"}),
])
def test_conventions(ips: list[str], rank: int, gpus: int, expected: dict[str, str]) -> None:
    env = conventions(ips, rank, gpus, 29400, "/x/hostfile")
    assert {k: env[k] for k in expected} == expected
    assert env["MASTER_PORT"] == "29400" and env["CLOUDTRAIN_HOSTFILE"] == "/x/hostfile"
    assert "CLOUDTRAIN_HOSTFILE" not in conventions(ips, rank, gpus, 29400, None)


@pytest.mark.parametrize("ips,gpus,text", [
    (["10.0.0.1"], 0, "10.0.0.1 slots=1\n"),
    (["a", "b"], 4, "a slots=4\nb slots=4\n"),
])
def test_the_prelude_writes_the_hostfile(tmp_path, ips: list[str], gpus: int, text: str) -> None:  # noqa: ANN001
    assert hostfile_text(ips, gpus) == text
    target = tmp_path / "hostfile"
    subprocess.run(["sh", "-c", hostfile_prelude(ips, gpus)], env={"CLOUDTRAIN_HOSTFILE": str(target)}, check=True)
    assert target.read_text() == text
    # Without the variable (a caller that sets none) the prelude writes nothing and succeeds.
    subprocess.run(["sh", "-c", hostfile_prelude(ips, gpus)], env={}, check=True, cwd=tmp_path)
