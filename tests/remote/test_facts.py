"""The host probe over real SSH, with and without (fake) NVIDIA tools on the node."""

from __future__ import annotations

import sys

from cloudtrain.remote.facts import GpuInfo, parse_probe, probe_host
from cloudtrain.remote.ssh import SSHTransport
from cloudtrain.testing.sshd import SshdVM

FAKE_NVIDIA_SMI = """#!/bin/sh
case "$*" in
  *--query-gpu*) printf 'Tesla T4, 15360, 535.104.05\\nTesla T4, 15360, 535.104.05\\n' ;;
  *) printf '| NVIDIA-SMI 535.104.05   Driver Version: 535.104.05   CUDA Version: 12.2     |\\n' ;;
esac
"""


def test_probe_without_gpus(transport: SSHTransport) -> None:
    facts = probe_host(transport)
    assert facts.python3 and facts.python3.startswith("/")
    assert facts.python_version and facts.python_version.startswith("3.")
    assert facts.has_rsync and not facts.has_nvidia_smi
    assert facts.gpus == () and facts.cuda_version is None
    assert facts.arch and facts.kernel.startswith("Linux")
    assert "GPUs: none" in facts.summary()


def test_probe_reads_nvidia_smi(transport: SSHTransport, sshd_vm: SshdVM) -> None:
    tool = sshd_vm.bin_dir / "nvidia-smi"
    tool.write_text(FAKE_NVIDIA_SMI)
    tool.chmod(0o755)
    facts = probe_host(transport)
    assert facts.gpus == (GpuInfo("Tesla T4", 15360), GpuInfo("Tesla T4", 15360))
    assert (facts.driver_version, facts.cuda_version, facts.gpu_count) == ("535.104.05", "12.2", 2)


def test_parse_tolerates_odd_output() -> None:
    facts = parse_probe("os=\nnoise without equals\ngpu=NVIDIA A100-SXM4-80GB, [N/A], 550.1\ngpu=Weird, Name, 81920, 550.1\n")
    assert facts.gpus == (GpuInfo("NVIDIA A100-SXM4-80GB", None), GpuInfo("Weird, Name", 81920))
    assert facts.python3 is None and not facts.has_rsync
    assert sys.platform  # parse is pure: no node needed
