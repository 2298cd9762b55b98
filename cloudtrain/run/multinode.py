"""The multi-node conventions every backend sets, so that any framework finds its peers.

PyTorch's `torchrun` reads MASTER_ADDR, MASTER_PORT, WORLD_SIZE, NODE_RANK (and NNODES,
NPROC_PER_NODE for its own flags); MPI reads a hostfile (`CLOUDTRAIN_HOSTFILE`: one `ADDRESS
slots=N` line per node); TensorFlow reads TF_CONFIG (run/job.py). WORLD_SIZE counts processes:
nodes x NPROC_PER_NODE (the GPUs per node, 1 without GPUs). Slurm sets the same names from its
allocation (templates/slurm_task.sh).
"""

from __future__ import annotations

import shlex
from collections.abc import Sequence

# torchrun's default is 29500, which TF_CONFIG's workers use on remote nodes (29500 + rank).
MASTER_PORT = 29400


def conventions(ips: Sequence[str], rank: int, gpus_per_node: int, master_port: int,
                hostfile: str | None) -> dict[str, str]:
    nproc = max(1, gpus_per_node)
    env = {
        "MASTER_ADDR": ips[0],
        "MASTER_PORT": str(master_port),
        "WORLD_SIZE": str(len(ips) * nproc),
        "NODE_RANK": str(rank),
        "NNODES": str(len(ips)),
        "NPROC_PER_NODE": str(nproc),
    }
    if hostfile is not None:
        env["CLOUDTRAIN_HOSTFILE"] = hostfile
    return env


def hostfile_text(ips: Sequence[str], gpus_per_node: int) -> str:
    return "".join(f"{ip} slots={max(1, gpus_per_node)}\n" for ip in ips)


def hostfile_prelude(ips: Sequence[str], gpus_per_node: int) -> str:
    """Shell lines that write the hostfile where CLOUDTRAIN_HOSTFILE says, before the job's own
    script (the file travels inside the script: no extra round trip)."""
    return (f'[ -z "${{CLOUDTRAIN_HOSTFILE:-}}" ] || printf %s {shlex.quote(hostfile_text(ips, gpus_per_node))} '
            '> "$CLOUDTRAIN_HOSTFILE"\n')
