"""Real OpenSSH sshd "VMs" on loopback, as pytest fixtures (`sshd_vm`, `sshd_vm_factory`).

Each VM is `/usr/sbin/sshd -D -e -f CONFIG` on 127.0.0.1 with a free port, its own ed25519 host
key, its own authorized_keys and its own home directory. Everything a test or cloudtrain does on a
VM happens over real SSH.

How a VM gets its own home while logging in as the current user (root in CI): sshd_config sets
`SetEnv HOME=<vm>/home PATH=<vm>/bin:...` and a `ForceCommand` that `cd`s to $HOME and then runs
the client's command with the user's shell, so `$HOME`, `~`, relative paths and rsync all see the
VM's home exactly as on a real machine. No system users are created and nothing outside the
VM's directory is touched. $PATH starts with the VM's bin/ (drop fake tools like nvidia-smi
there) and the test interpreter's directory, so `python3` on the VM has what the tests have.

Routing fake addresses: `vm.proxy_command` reaches this VM from any address; the factory's
`proxy_command` looks the address up in a JSON map (`factory.route(address, vm)`, or VMs from a
pool assigned on first contact), so `config.ssh.proxy_command` can send a fake cloud's 54.x IPs
to loopback VMs. See cloudtrain/testing/route.py.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloudtrain.providers.base import HostSpec, Instance, InstanceState

# Re-exported so the pytest plugin (which collects fixtures from this module) offers it too.
from cloudtrain.testing.tcpproxy import tcp_proxy  # noqa: F401

SSHD = "/usr/sbin/sshd"
_SFTP_SERVER = "/usr/lib/openssh/sftp-server"
_FORCE_COMMAND = (
    'cd "$HOME" && if [ -n "$SSH_ORIGINAL_COMMAND" ]; then exec "$SHELL" -c "$SSH_ORIGINAL_COMMAND"; '
    'else exec "$SHELL" -l; fi'
)


@dataclass(frozen=True)
class ClientKey:
    private_path: Path
    public_openssh: str


def _keys():  # type: ignore[no-untyped-def]
    """cloudtrain.remote.keys, imported on first use: it loads pydantic, and the plugin that
    imports this module is loaded by every pytest run where cloudtrain is installed."""
    from cloudtrain.remote import keys

    return keys


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class SshdVM:
    """One sshd on loopback. Start/stop/restart it like a machine; read its files via `home`."""

    def __init__(
        self,
        root: Path,
        *,
        name: str,
        authorized_keys: Sequence[str] = (),
        authorized_keys_command: str | None = None,
        path_prepend: Sequence[str] = (),
        port: int | None = None,
    ) -> None:
        self.root = root
        self.name = name
        self.user = _keys().current_user()
        self.host = "127.0.0.1"
        self.port = port or free_port()
        self.home_dir = root / "home"
        self.bin_dir = root / "bin"
        self.host_key = root / "ssh_host_ed25519_key"
        self.authorized_keys_file = root / "authorized_keys"
        self.authorized_keys_command = authorized_keys_command
        self.path_prepend = tuple(path_prepend)
        self._proc: subprocess.Popen[bytes] | None = None
        for directory in (root, self.home_dir, self.bin_dir):
            directory.mkdir(parents=True, exist_ok=True)
        self.authorized_keys_file.write_text("".join(k.strip() + "\n" for k in authorized_keys))
        self.new_host_key()

    # --------------------------------------------------------------- machine-like controls

    @property
    def home(self) -> str:
        return str(self.home_dir)

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def host_key_fingerprint(self) -> str:
        import base64

        blob = base64.b64decode(self.host_key.with_suffix(".pub").read_text().split()[1])
        return _keys().fingerprint(blob)

    @property
    def proxy_command(self) -> str:
        """A ProxyCommand that reaches this VM whatever address it is given (%h %p are ignored)."""
        return f"{shlex.quote(sys.executable)} -m cloudtrain.testing.route --to {self.port} %h %p"

    def new_host_key(self) -> None:
        """Replace the host key (a reinstalled machine). Takes effect on the next start."""
        self.host_key.unlink(missing_ok=True)
        _keys().generate_ed25519(self.host_key, f"{self.name}-host")
        # generate_ed25519 writes `<key>.pub`; sshd expects that name for the public half too.
        os.replace(self.host_key.with_name(self.host_key.name + ".pub"), self.host_key.with_suffix(".pub"))

    def authorize(self, public_key: str) -> None:
        with self.authorized_keys_file.open("a") as handle:
            handle.write(public_key.strip() + "\n")

    def start(self) -> SshdVM:
        if self.running:
            return self
        if os.geteuid() == 0:
            # sshd's privilege separation directory; root-only requirement.
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        for attempt in range(5):
            self._write_config()
            log = (self.root / "sshd.log").open("ab")
            log_start = log.tell()  # a restart appends: only this start's lines count
            self._proc = subprocess.Popen(
                [SSHD, "-D", "-e", "-f", str(self.root / "sshd_config")],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            )
            log.close()
            if self._wait_listening(log_start):
                return self
            text = self.log_text()[log_start:]
            self._proc = None
            if "Address already in use" in text and attempt < 4:
                self.port = free_port()
                continue
            raise RuntimeError(f"sshd for VM {self.name} did not start:\n{text[-3000:]}")
        raise RuntimeError(f"sshd for VM {self.name} could not find a free port")

    def stop(self) -> None:
        """Power off: the listener, every session, and every job the VM's runner started."""
        if self._proc is not None:
            # Per-connection sshd processes outlive a SIGTERM to the listener (that is how sshd
            # restarts work) and run in sessions of their own; a powered-off machine has none.
            sessions = _descendants(self._proc.pid)
            for pid in sessions:
                _kill(pid)
            # Let the listener reap its direct children before it goes (orphans wait for init).
            _wait_gone([pid for pid in sessions if _parent(pid) == self._proc.pid], 1.0)
            try:
                os.killpg(self._proc.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self._proc.pid, signal.SIGKILL)
                self._proc.wait()
            self._proc = None
        self._kill_sessions()
        self._kill_jobs()
        self._settle()

    def _settle(self) -> None:
        # A session its sshd forked just before the listener went can be between fork and exec (not
        # yet carrying the VM's HOME) during the first sweep, and exec runner.sh a moment later: sweep
        # again until a few sweeps in a row find nothing, as a machine that is off runs nothing.
        quiet, deadline = 0, time.monotonic() + 3.0
        while quiet < 3 and time.monotonic() < deadline:
            strays = _pids_with_env(f"HOME={self.home_dir}") + _pids_with_arg_under(self.home_dir)
            for pid in strays:
                _kill(pid)
            quiet = 0 if strays else quiet + 1
            time.sleep(0.05)

    def restart(self, *, new_host_key: bool = False) -> SshdVM:
        self.stop()
        if new_host_key:
            self.new_host_key()
        return self.start()

    def log_text(self) -> str:
        path = self.root / "sshd.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --------------------------------------------------------------- records for cloudtrain

    def instance(self, instance_id: str | None = None, *, cluster: str = "test", address: str | None = None,
                 launched_at: float | None = None) -> Instance:
        """An Instance record for this VM (direct: 127.0.0.1 and the VM's port, unless address)."""
        return Instance(
            id=instance_id or f"vm-{self.name}",
            cluster=cluster,
            state=InstanceState.RUNNING,
            public_ip=address or self.host,
            private_ip=self.host,
            ssh_user=self.user,
            ssh_port=self.port if address is None else 22,
            launched_at=launched_at,
        )

    def host_spec(self, key: Path | str | None = None, *, proxy: bool = False) -> HostSpec:
        return HostSpec(
            address=self.host, user=self.user, port=self.port, key=str(key) if key else None,
            proxy_command=self.proxy_command if proxy else None,
        )

    # --------------------------------------------------------------- internals

    def _write_config(self) -> None:
        path = ":".join([str(self.bin_dir), *self.path_prepend,
                         "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"])
        lines = [
            f"Port {self.port}",
            "ListenAddress 127.0.0.1",
            f'HostKey "{self.host_key}"',
            f'PidFile "{self.root / "sshd.pid"}"',
            f'AuthorizedKeysFile "{self.authorized_keys_file}"',
            "PubkeyAuthentication yes",
            "PasswordAuthentication no",
            "KbdInteractiveAuthentication no",
            "UsePAM no",
            "StrictModes no",
            "PermitRootLogin prohibit-password",
            f"AllowUsers {self.user}",
            "MaxStartups 100:30:200",
            f'SetEnv "HOME={self.home_dir}" "PATH={path}"',
            f"ForceCommand {_FORCE_COMMAND}",
            f"Subsystem sftp {_SFTP_SERVER if Path(_SFTP_SERVER).exists() else 'internal-sftp'}",
        ]
        if self.authorized_keys_command:
            user = "root" if os.geteuid() == 0 else self.user
            lines += [f"AuthorizedKeysCommand {self.authorized_keys_command}", f"AuthorizedKeysCommandUser {user}"]
        (self.root / "sshd_config").write_text("\n".join(lines) + "\n")

    def _wait_listening(self, log_start: int, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        needle = f"Server listening on 127.0.0.1 port {self.port}".encode()
        while time.monotonic() < deadline:
            if self._proc is None or self._proc.poll() is not None:
                return False
            with (self.root / "sshd.log").open("rb") as handle:
                handle.seek(log_start)
                if needle in handle.read():
                    return True
            time.sleep(0.005)
        return False

    def _kill_sessions(self) -> None:
        # Commands the VM ran, and detached jobs they started, carry the VM's HOME.
        for pid in _pids_with_env(f"HOME={self.home_dir}"):
            _kill(pid)

    def _kill_jobs(self) -> None:
        killed = []
        for pid_file in self.home_dir.glob(".cloudtrain/*/jobs/*/pid"):
            if (pid_file.parent / "exit_code").exists():
                continue
            try:
                pgid = int(pid_file.read_text().strip())
                os.killpg(pgid, signal.SIGKILL)
                killed.append(pgid)
            except (ValueError, ProcessLookupError, PermissionError):
                continue
        # A killed job is a zombie until init reaps it, and `kill -0` (the runner's liveness
        # check) still succeeds on a zombie: wait, so the VM reports the job lost like a real one.
        _wait_gone(killed, 5.0)


def _wait_gone(pids: Sequence[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in pids):
        time.sleep(0.02)


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        return


def _parent(pid: int) -> int | None:
    try:
        # Field 4 of /proc/PID/stat is the parent pid; the name in field 2 may hold spaces.
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _descendants(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit() and (ppid := _parent(int(proc.name))) is not None:
            children.setdefault(ppid, []).append(int(proc.name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _pids_with_arg_under(directory: Path) -> list[int]:
    """Processes running a program or script from under `directory` (a VM's runner, its jobs)."""
    prefix = str(directory).encode() + b"/"
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            args = (proc / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if any(arg.startswith(prefix) for arg in args):
            found.append(int(proc.name))
    return found


def _pids_with_env(*entries: str) -> list[int]:
    needles = [b"\0" + entry.encode() + b"\0" for entry in entries]
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            environ = b"\0" + (proc / "environ").read_bytes()
        except OSError:
            continue
        if any(needle in environ for needle in needles):
            found.append(int(proc.name))
    return found


class SshdFactory:
    """Starts VMs that all accept `client_key` (plus any extra keys), and routes addresses to them.

    `proxy_command` is a ProxyCommand (for `config.ssh.proxy_command`) that sends any address to a
    VM: one given a route (`route(address, vm)` or `start(address=...)`), else the next VM offered
    with `start(pool=True)` that no address holds yet. `trust(key)` makes every VM, running or
    started later, accept a public key (as cloud-init installs a launch key).
    """

    def __init__(self, base: Path) -> None:
        self.base = base
        self.vms: list[SshdVM] = []
        self.trusted: list[str] = []
        base.mkdir(parents=True, exist_ok=True)
        key_path = base / "client_ed25519"
        self.client_key = ClientKey(key_path, _keys().generate_ed25519(key_path, "cloudtrain-test-client"))
        self.routes_file = base / "routes.json"
        self._routes_lock = threading.Lock()
        self._save_routes({"routes": {}, "pool": [], "assigned": {}})

    @property
    def user(self) -> str:
        """The login user every VM accepts (the user running the tests)."""
        return _keys().current_user()

    @property
    def proxy_command(self) -> str:
        """ProxyCommand routing any address through the route map (set it as config.ssh.proxy_command)."""
        return f"{shlex.quote(sys.executable)} -m cloudtrain.testing.route --routes {shlex.quote(str(self.routes_file))} %h %p"

    def start(
        self,
        *,
        authorized_keys: Sequence[str] = (),
        authorized_keys_command: str | None = None,
        path_prepend: Sequence[str] | None = None,
        address: str | None = None,
        pool: bool = False,
        name: str | None = None,
    ) -> SshdVM:
        """Start one VM. `address`: route that fake address to it; `pool`: offer it to unknown
        addresses; `name`: its directory name under the factory's base (default vm0, vm1, ...)."""
        name = name or f"vm{len(self.vms)}"
        vm = SshdVM(
            self.base / name,
            name=name,
            authorized_keys=[self.client_key.public_openssh, *self.trusted, *authorized_keys],
            authorized_keys_command=authorized_keys_command,
            path_prepend=[str(Path(sys.executable).parent)] if path_prepend is None else path_prepend,
        )
        self.vms.append(vm)
        vm.start()
        if address:
            self.route(address, vm)
        if pool:
            data = self._load_routes()
            data["pool"].append(vm.port)
            self._save_routes(data)
        return vm

    def trust(self, public_key: str) -> None:
        """Every VM, running or started later, accepts `public_key` (an OpenSSH public key line)."""
        line = public_key.strip()
        if not line or line in self.trusted:
            return
        self.trusted.append(line)
        for vm in self.vms:
            vm.authorize(line)

    def start_many(self, count: int, **kwargs: object) -> list[SshdVM]:
        return [self.start(**kwargs) for _ in range(count)]  # type: ignore[arg-type]

    def route(self, address: str, vm: SshdVM) -> None:
        """Send connections for `address` (any string a ProxyCommand gets as %h) to `vm`."""
        with self._routes_lock:  # fake clouds route from their request threads
            data = self._load_routes()
            data["routes"][address] = vm.port
            self._save_routes(data)

    def set_ingress(self, address: str, rules: list[dict] | None) -> None:
        """The network rules a fake cloud evaluates for connections to `address` (None: no rules,
        every connection admitted); the rule format is cloudtrain.testing.route's."""
        with self._routes_lock:
            data = self._load_routes()
            ingress = data.setdefault("ingress", {})
            if rules is None:
                ingress.pop(address, None)
            else:
                ingress[address] = rules
            self._save_routes(data)

    def set_source(self, address: str) -> None:
        """The address connections come from, as the fake clouds' network rules see it."""
        with self._routes_lock:
            data = self._load_routes()
            data["source"] = address
            self._save_routes(data)

    def close(self) -> None:
        for vm in self.vms:
            vm.stop()

    def _load_routes(self) -> dict:
        return json.loads(self.routes_file.read_text())

    def _save_routes(self, data: dict) -> None:
        tmp = self.routes_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, self.routes_file)


def sshd_available() -> bool:
    return Path(SSHD).exists()


@pytest.fixture
def sshd_vm_factory(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SshdFactory]:
    """Factory of real OpenSSH sshd "VMs" on loopback (`SshdFactory`).

    `sshd_vm_factory.start()` boots one (`SshdVM`: its own port, host key, authorized keys and home
    directory, under this test's temp dir) that accepts `sshd_vm_factory.client_key` and logs in as
    the user running the tests. Route fake addresses to VMs with `start(address=...)`,
    `start(pool=True)` or `route(address, vm)` and `proxy_command`. Every VM is stopped at
    teardown, with every session and detached job it ran. Needs /usr/sbin/sshd
    (`apt-get install openssh-server`): skipped without it, failed without it when $CI is set.
    """
    if not sshd_available():
        message = f"{SSHD} is not installed (apt-get install openssh-server)"
        # In CI a missing sshd is a broken setup, not a reason to pass quietly.
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    factory = SshdFactory(tmp_path_factory.mktemp("sshd"))
    yield factory
    factory.close()


@pytest.fixture
def sshd_vm(sshd_vm_factory: SshdFactory) -> SshdVM:
    """One running sshd VM (`SshdVM`) on 127.0.0.1:`sshd_vm.port`, accepting
    `sshd_vm_factory.client_key` for `sshd_vm.user`; its home is `sshd_vm.home_dir`.
    `stop()` / `start()` / `restart(new_host_key=True)` power-cycle it like a machine."""
    return sshd_vm_factory.start()
