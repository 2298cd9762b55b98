"""Every backend gives a multi-node job the same conventions: MASTER_ADDR, MASTER_PORT, WORLD_SIZE,
NODE_RANK, NNODES, NPROC_PER_NODE and an MPI hostfile, consistent across ranks (Slurm's own test,
from its allocation, is in test_slurm_e2e.py)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.testing.cloud import FakeCloud

# Each rank prints what it sees into its own log (every node's log comes home).
SCRIPT = ('echo "CONV $NODE_RANK $MASTER_ADDR $MASTER_PORT $WORLD_SIZE $NNODES $NPROC_PER_NODE '
          '$CLOUDTRAIN_NODE_IPS $(tr " \\n" "_;" < "$CLOUDTRAIN_HOSTFILE")"')


def conventions(log: Path) -> list[str]:
    line = next(line for line in log.read_text().splitlines() if line.startswith("CONV "))
    return line.split()[1:]


@pytest.mark.parametrize("name", ["ssh", "aws"])
def test_every_rank_sees_the_same_cluster(fake_cloud: Callable[[str], FakeCloud], name: str) -> None:
    cloud = fake_cloud(name)
    result = cloud.run(cloud.recipe(run=SCRIPT, num_nodes=2))
    assert result.ok, result.output[-3000:]
    assert result.run_dir is not None
    seen = {0: conventions(result.run_dir / "job.log"), 1: conventions(result.run_dir / "node-1-job.log")}
    assert [seen[0][0], seen[1][0]] == ["0", "1"]  # NODE_RANK
    # Everything else is the same on both ranks: master, port, sizes, addresses, hostfile.
    assert seen[0][1:] == seen[1][1:]
    master, port, world, nnodes, nproc, ips, hostfile = seen[0][1:8]
    addresses = ips.split(",")
    assert master == addresses[0] and port.isdigit() and (world, nnodes, nproc) == ("2", "2", "1")
    assert hostfile == "".join(f"{ip}_slots=1;" for ip in addresses)
