"""A stock sshd for the benchmarks: the distribution's own sshd_config, not the test kit's.

The test kit's sshd (cloudtrain.testing.sshd) makes sessions cheap (UsePAM no, a ForceCommand);
a real VM's sshd runs PAM and a login shell for every session, which is what a tool that opens a
session per command pays for. This one starts /usr/sbin/sshd with the settings of
/etc/ssh/sshd_config (UsePAM yes etc. on Debian and Ubuntu, without its Include of local drop-ins)
plus only what a loopback instance needs: its port, host key, pid file and authorized_keys
(StrictModes no: that file lives under /tmp). No
ForceCommand: commands run as on a VM, through the user's shell, in the user's home directory.
`SetEnv HOME=<vm home>` keeps what the benchmark writes in its own directory (PAM's session
modules still run).

The home is a fresh ext4 filesystem of its own (an image file on a loop device, as a new VM's
disk) when this runs as root and can mount one; otherwise a directory here (`vm.disk` says which).
On a busy, nearly full disk, creating files is slow for minutes after many were deleted (ext4
skips recently deleted inodes, in kernel time): a `down` of 5,000 files made the next `up`'s
files cost 1-3 s more, whichever tool wrote next. A VM's own fresh disk has no such history.

    vm = StockSshd(root, client_public_key).start()   # vm.port, vm.user, vm.home, vm.disk; vm.close()
"""

from __future__ import annotations

import getpass
import os
import shutil
import subprocess
import time
from pathlib import Path

SSHD = "/usr/sbin/sshd"
SYSTEM_CONFIG = Path("/etc/ssh/sshd_config")
# What a private instance must set itself; every other line of the system file is kept.
_OWN = ("port", "listenaddress", "hostkey", "pidfile", "authorizedkeysfile", "include", "setenv", "forcecommand",
        "strictmodes")


class StockSshd:
    def __init__(self, root: Path, authorized_key: str, disk_mb: int = 4096) -> None:
        self.root = root
        self.user = getpass.getuser()
        self.home = str(root / "home")
        self.port = _free_port()
        (root / "home").mkdir(parents=True, exist_ok=True)
        self.disk = self._mount_fresh_disk(root / "home", disk_mb)
        self._keys = root / "authorized_keys"
        self._keys.write_text(authorized_key.strip() + "\n")
        self._proc: subprocess.Popen[bytes] | None = None

    def _mount_fresh_disk(self, home: Path, disk_mb: int) -> str:
        self._mounted: Path | None = None
        if os.geteuid() != 0 or not shutil.which("mkfs.ext4") or not shutil.which("mount"):
            return "a directory on this machine's disk (not root, or no mkfs.ext4: no fresh filesystem)"
        image = self.root / "disk.img"
        with open(image, "wb") as handle:
            handle.truncate(disk_mb << 20)  # sparse: only what is written takes space
        made = subprocess.run(["mkfs.ext4", "-q", "-F", str(image)], capture_output=True, text=True)
        mounted = made.returncode == 0 and subprocess.run(
            ["mount", "-o", "loop", str(image), str(home)], capture_output=True, text=True).returncode == 0
        if not mounted:
            image.unlink()
            return "a directory on this machine's disk (no loop device to mount a fresh filesystem)"
        self._mounted = home
        return f"a fresh ext4 filesystem of its own ({disk_mb} MiB image on a loop device), as a new VM's disk"

    def config_text(self) -> str:
        system = SYSTEM_CONFIG.read_text() if SYSTEM_CONFIG.exists() else "UsePAM yes\n"
        kept = [line for line in system.splitlines()
                if line.strip() and not line.lstrip().startswith("#") and line.split()[0].lower() not in _OWN]
        own = [
            f"Port {self.port}", "ListenAddress 127.0.0.1", f'HostKey "{self.root / "host_key"}"',
            f'PidFile "{self.root / "sshd.pid"}"', f'AuthorizedKeysFile "{self._keys}"',
            f'SetEnv "HOME={self.home}"',
            # The key file lives under /tmp (mode 1777), which StrictModes refuses; no effect on cost.
            "StrictModes no",
        ]
        return "\n".join(own + kept) + "\n"

    def start(self) -> StockSshd:
        if not (self.root / "host_key").exists():
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(self.root / "host_key")],
                           check=True)
        config = self.root / "sshd_config"
        config.write_text(self.config_text())
        log = (self.root / "sshd.log").open("wb")
        self._proc = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT,
                                      stdin=subprocess.DEVNULL, start_new_session=True)
        log.close()
        needle = f"Server listening on 127.0.0.1 port {self.port}"
        deadline = time.monotonic() + 10
        while needle not in (self.root / "sshd.log").read_text(errors="replace"):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"stock sshd did not start:\n{(self.root / 'sshd.log').read_text()[-2000:]}")
            time.sleep(0.01)
        return self

    def close(self) -> None:
        if self._proc is not None:
            import os
            import signal

            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            self._proc.wait(timeout=10)
            self._proc = None
        if self._mounted is not None:
            subprocess.run(["umount", "-l", str(self._mounted)], check=False)
            (self.root / "disk.img").unlink(missing_ok=True)
            self._mounted = None


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
