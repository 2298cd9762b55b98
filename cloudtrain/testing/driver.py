"""A driver host for `cloudtrain run --driver` (docs/driver.md): an sshd VM the user "already has".

`driver_host(factory, env=..., config=...)` starts a kit sshd VM (sshd.py) and writes its login
profile (`~/.profile` in the VM's own home, never the real `~`), as a user would set up a build
box: PATH with this interpreter's directory first (so `cloudtrain` there is the one under test),
its own CLOUDTRAIN_HOME and config, and whatever `env` says, such as a fake cloud's endpoint and
credentials (the host's own, not the laptop's). Commands reach it through the login shell
(`bash -l`), which reads that profile after /etc/profile resets PATH.

Teardown is the VM's (`SshdFactory.close()`): stopping it kills every process carrying its HOME,
the detached driven run and what it started included.
"""

from __future__ import annotations

import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cloudtrain.testing.sshd import SshdFactory, SshdVM


@dataclass(frozen=True)
class DriverHostVM:
    vm: SshdVM
    home: Path  # the VM's HOME
    cloudtrain_home: Path  # its CLOUDTRAIN_HOME (state, keys of the clusters it drives)
    config_path: Path
    address: str | None = None  # a name the laptop's `ssh.proxy_command` routes to the VM

    @property
    def label(self) -> str:
        """`user@127.0.0.1:port` (or `user@ADDRESS`, routed), as `--driver` takes it."""
        return f"{self.vm.user}@{self.address}" if self.address else f"{self.vm.user}@{self.vm.host}:{self.vm.port}"

    def drives(self) -> list[Path]:
        """The drive directories `run --driver` made on it."""
        return sorted((self.home / ".cloudtrain-driver").glob("*"))

    def env(self) -> dict[str, str]:
        """The environment its login shell gives the driven `cloudtrain` (for running it here, in a test)."""
        return {"HOME": str(self.home), "CLOUDTRAIN_HOME": str(self.cloudtrain_home),
                "CLOUDTRAIN_CONFIG": str(self.config_path)}


def driver_host(factory: SshdFactory, *, env: Mapping[str, str] | None = None,
                config: Mapping[str, Any] | None = None, path: str | None = None,
                address: str | None = None) -> DriverHostVM:
    """Start a driver host. `path`: the PATH its profile sets (default: this interpreter's directory,
    then the system's); `env`: more variables its profile exports; `config`: its cloudtrain config;
    `address`: a name the factory's `proxy_command` routes to it (for a laptop whose config has one,
    as a fake cloud's does: it reaches the host through it, as through a bastion)."""
    import yaml

    vm = factory.start(address=address)
    home = vm.home_dir
    ct_home = home / ".local" / "share" / "cloudtrain"
    ct_home.mkdir(parents=True, exist_ok=True, mode=0o700)
    config_path = home / "cloudtrain-config.yaml"
    config_path.write_text(yaml.safe_dump(dict(config or {})))
    search = path if path is not None else f"{vm.bin_dir}:{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin"
    exports = {"PATH": search, "CLOUDTRAIN_HOME": str(ct_home), "CLOUDTRAIN_CONFIG": str(config_path),
               # A watchdog started from a test never installs itself into the developer's crontab.
               "CLOUDTRAIN_WATCHDOG_PERSIST": "none", **(env or {})}
    exports.pop("HOME", None)  # sshd sets the VM's own
    (home / ".profile").write_text("".join(f"export {k}={shlex.quote(v)}\n" for k, v in exports.items()))
    return DriverHostVM(vm, home, ct_home, config_path, address)
