"""A test node that behaves like a fresh cloud image: Debian 12 (minbase) with its own filesystem,
distro Python 3.11 (PEP 668: `pip install` refused outside a venv), no TensorFlow, no rsync, none
of the test machine's packages; sshd for the login user `ubuntu`, who has passwordless sudo as on
cloud images. The kit's sshd "VMs" share the test machine's Python and files, so they hide what a
real image lacks; this one does not.

How: `mmdebstrap` (Debian's own tool) builds the rootfs once per cache directory (~20 s from the
Debian mirror); each node is an overlay of it (its own writable layer, thrown away at stop) in a
new mount and pid namespace (`unshare`), with its own /proc, /tmp and /run, and sshd chrooted
into it. The network namespace is the test machine's, so the node listens on 127.0.0.1 only and
is reached like any kit VM. Its pip is pointed at a closed loopback port (/etc/pip.conf): nothing
a test does there reaches the internet, and an install that needs an index fails at once, with
pip's own reason. Needs root (namespaces, overlay, chroot) and mmdebstrap; `fresh_node_available()`.

pid 1 of the node's namespace is a small reaper (this machine's Python, outside the chroot): jobs
started detached (runner.sh's setsid) are reparented to it and must not stay zombies, which
`kill -0` would take for running processes.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

SUITE = "bookworm"
PACKAGES = ("openssh-server", "python3", "python3-venv", "ca-certificates", "sudo", "procps")
USER = "ubuntu"
# A closed loopback port: pip inside the node fails at once ("Connection refused"), offline.
PIP_CONF = "[global]\nindex-url = http://127.0.0.1:9/simple/\nretries = 0\ntimeout = 5\n"
STAMP = ".cloudtrain-rootfs"

# pid 1 inside the namespace: mount the node's filesystems, start sshd chrooted, reap every orphan.
_INIT = r"""
import os, signal, subprocess, sys
merged, port, keys = sys.argv[1], sys.argv[2], sys.argv[3]
def mount(*args):
    subprocess.run(["mount", *args], check=True)
mount("--make-rprivate", "/")
mount("--rbind", "/dev", f"{merged}/dev")
mount("-t", "proc", "proc", f"{merged}/proc")
for tmp in ("tmp", "run"):
    mount("-t", "tmpfs", "-o", "mode=1777" if tmp == "tmp" else "mode=755", "tmpfs", f"{merged}/{tmp}")
os.makedirs(f"{merged}/run/sshd", mode=0o755, exist_ok=True)
import socket
with open(f"{merged}/etc/hosts", "w") as handle:  # sudo resolves the host's name (the UTS namespace is shared)
    handle.write(f"127.0.0.1 localhost\n127.0.1.1 {socket.gethostname()}\n")
home = f"{merged}/home/ubuntu/.ssh"
os.makedirs(home, mode=0o700, exist_ok=True)
with open(f"{home}/authorized_keys", "w") as handle:
    handle.write(open(keys).read())
for path in (home, f"{home}/authorized_keys"):
    os.chown(path, 1000, 1000)
os.chmod(f"{home}/authorized_keys", 0o600)
sshd = subprocess.Popen(["chroot", merged, "/usr/sbin/sshd", "-D", "-e", "-p", port, "-o", "ListenAddress=127.0.0.1",
                         "-o", "PasswordAuthentication=no", "-o", "UseDNS=no"])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # pid 1 exits: the kernel ends the namespace
sys.stdout.write("ready\n")
sys.stdout.flush()
while True:
    try:
        pid, _ = os.wait()
    except ChildProcessError:
        signal.pause()
        continue
    if pid == sshd.pid:
        sys.exit(1)
"""


def fresh_node_available() -> str | None:
    """None when this machine can run fresh-image nodes, else why not."""
    if os.geteuid() != 0:
        return "needs root (mount and pid namespaces, overlayfs, chroot)"
    for tool in ("mmdebstrap", "unshare", "chroot", "mount"):
        if shutil.which(tool) is None:
            return f"needs {tool} (apt-get install mmdebstrap)"
    return None


def build_rootfs(cache: Path) -> Path:
    """The Debian rootfs under `cache` (built once: reused while its stamp is there). Two test
    workers sharing a cache take turns: the second finds the first's stamp."""
    root = cache / f"debian-{SUITE}"
    if (root / STAMP).exists():
        return root
    cache.mkdir(parents=True, exist_ok=True)
    with open(cache / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (root / STAMP).exists():
            _build(root)
    return root


def _build(root: Path) -> None:
    shutil.rmtree(root, ignore_errors=True)
    subprocess.run(["mmdebstrap", "--quiet", "--variant=minbase", f"--include={','.join(PACKAGES)}", SUITE,
                    str(root)], check=True, stdout=subprocess.DEVNULL, timeout=900)
    script = (f"useradd -m -s /bin/sh {USER} && ssh-keygen -A >/dev/null && "
              f"echo '{USER} ALL=(ALL) NOPASSWD:ALL' > /etc/sudoers.d/90-cloud && chmod 440 /etc/sudoers.d/90-cloud")
    subprocess.run(["chroot", str(root), "sh", "-c", script], check=True, timeout=120)
    (root / "etc" / "pip.conf").write_text(PIP_CONF)
    (root / STAMP).write_text(f"{SUITE} {' '.join(PACKAGES)}\n")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class FreshNode:
    """One node: an overlay of the rootfs in namespaces of its own, sshd on 127.0.0.1:`port`."""

    rootfs: Path
    base: Path
    authorized_keys: Sequence[str]
    user: str = USER
    port: int = field(default_factory=_free_port)
    _proc: subprocess.Popen | None = None

    @property
    def root(self) -> Path:
        """The node's filesystem as this machine sees it (the overlay's writable layer)."""
        return self.base / "upper"

    def start(self) -> FreshNode:
        for part in ("upper", "work", "merged"):
            (self.base / part).mkdir(parents=True, exist_ok=True)
        keys = self.base / "authorized_keys"
        keys.write_text("".join(k.strip() + "\n" for k in self.authorized_keys))
        merged = self.base / "merged"
        overlay = (f"mount -t overlay overlay -o lowerdir={self.rootfs},upperdir={self.base / 'upper'},"
                   f"workdir={self.base / 'work'} {merged} && exec {sys.executable} -c \"$0\" \"$@\"")
        self._proc = subprocess.Popen(
            ["unshare", "--mount", "--pid", "--fork", "--kill-child", "sh", "-c", overlay, _INIT, str(merged),
             str(self.port), str(keys)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        assert self._proc.stdout is not None
        if self._proc.stdout.readline().strip() != b"ready":
            self.stop()
            raise RuntimeError(f"fresh node did not start: {self._proc.stderr.read().decode()[-500:]}")
        deadline = time.monotonic() + 30
        while True:  # sshd is up once it accepts (a bound on a broken start, not a timing assertion)
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return self
            except OSError:
                if time.monotonic() > deadline or self._proc.poll() is not None:
                    self.stop()
                    raise RuntimeError("fresh node's sshd never listened") from None
                time.sleep(0.05)

    def stop(self) -> None:
        """End the namespace (every process in it) and drop the writable layer."""
        if self._proc is not None and self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGTERM)
            try:
                self._proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait(timeout=30)
        if self._proc is not None:
            for stream in (self._proc.stdout, self._proc.stderr):
                if stream is not None:
                    stream.close()
        self._proc = None
        shutil.rmtree(self.base, ignore_errors=True)


@pytest.fixture(scope="session")
def fresh_rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The Debian rootfs fresh nodes boot (built once per session, or taken from
    $CLOUDTRAIN_TEST_ROOTFS_CACHE, which scripts/setup.sh --test fills)."""
    why = fresh_node_available()
    if why is not None:
        pytest.skip(f"fresh-image nodes: {why}")
    cache = os.environ.get("CLOUDTRAIN_TEST_ROOTFS_CACHE")
    return build_rootfs(Path(cache) if cache else tmp_path_factory.mktemp("rootfs"))


@pytest.fixture
def fresh_node_factory(fresh_rootfs: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[
        list[FreshNode]]:
    """Start nodes with `FreshNode(fresh_rootfs, base, keys).start()` appended to this list;
    every one is stopped at teardown."""
    started: list[FreshNode] = []
    yield started
    for node in started:
        node.stop()
