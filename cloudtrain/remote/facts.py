"""What a node offers (OS, python3, rsync, GPUs), probed over its Transport in one command.

Providers never open SSH, so the reachability/GPU check of an existing host lives here and
lifecycle calls it once a transport is open. The probe script is templates/probe.sh.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudtrain import paths
from cloudtrain.remote.transport import Transport


@dataclass(frozen=True)
class GpuInfo:
    name: str
    memory_mib: int | None


@dataclass(frozen=True)
class HostFacts:
    os: str
    kernel: str
    arch: str
    python3: str | None  # path on the node
    python_version: str | None
    has_rsync: bool
    has_nvidia_smi: bool
    gpus: tuple[GpuInfo, ...]
    driver_version: str | None
    cuda_version: str | None

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    def summary(self) -> str:
        gpus = ", ".join(f"{g.name} ({g.memory_mib} MiB)" if g.memory_mib else g.name for g in self.gpus)
        python = f"python {self.python_version}" if self.python_version else "no python3"
        return f"{self.os} {self.arch}, {python}, GPUs: {gpus or 'none'}"


def probe_host(transport: Transport) -> HostFacts:
    """Run the probe on the node (also proves it is reachable and runs commands)."""
    script = (paths.templates_dir() / "probe.sh").read_text()
    return parse_probe(transport.run(["sh", "-c", script], timeout=60).text)


def parse_probe(text: str) -> HostFacts:
    values: dict[str, str] = {}
    gpus: list[GpuInfo] = []
    driver: str | None = None
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if not sep:
            continue
        value = value.strip()
        if key == "gpu":
            # "Tesla T4, 15360, 535.104.05": split from the right, a name may hold a comma.
            parts = [p.strip() for p in value.rsplit(",", 2)]
            if len(parts) == 3:
                name, memory, driver = parts
            else:
                name, memory = parts[0], ""
            gpus.append(GpuInfo(name, int(memory) if memory.isdigit() else None))
        else:
            values[key] = value
    return HostFacts(
        os=values.get("os", ""),
        kernel=values.get("kernel", ""),
        arch=values.get("arch", ""),
        python3=values.get("python3") or None,
        python_version=values.get("python_version") or None,
        has_rsync=values.get("rsync") == "1",
        has_nvidia_smi=values.get("nvidia_smi") == "1",
        gpus=tuple(gpus),
        driver_version=driver or None,
        cuda_version=values.get("cuda") or None,
    )
