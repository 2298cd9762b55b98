"""The real CLI, started by fork from an interpreter that has already imported it.

A test that runs `cloudtrain ARGS` as a subprocess pays the interpreter's start and the imports
of what the verb needs before it does anything: 0.2 s for `status`, 0.5-1 s for a verb that
reads a recipe or calls boto3, 2-4 s for one that builds a Compute Engine client. The suite runs
thousands of them; most of its CPU went there (issue 36).

So each test process keeps one server (`python -m cloudtrain.testing.forkcli`) that imports
cloudtrain's commands and the clouds' SDKs once and waits. Asked to run a command, it forks: the
child takes the caller's argv, environment, working directory and stdin/stdout/stderr (passed
over a unix socket), resets its signals as a fresh interpreter has them, and runs
`python -m cloudtrain` as `runpy` does, to a normal interpreter exit (atexit handlers, flushed
streams, joined threads). It is a process of its own, in the caller's process group, with its
own pid, which the server reports; its exit status comes back when it ends. What differs from a
fresh interpreter is only which modules are already in `sys.modules`: whether a verb imports an
SDK is checked by tests that start the CLI themselves (tests/test_verb_imports.py), and
`CLOUDTRAIN_TEST_FORK_CLI=0` turns this off for a whole run.

Only `FakeCloud.cli` and the suite's `cloudtrain()` helper use it: a test that signals the CLI
or reads its output while it runs starts it with subprocess, as a user's shell would.
"""

from __future__ import annotations

import array
import atexit
import gc
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ENABLE_ENV = "CLOUDTRAIN_TEST_FORK_CLI"

# What a verb may import, loaded once by the server. Missing ones (an extra not installed) are
# skipped: the child imports what it needs as a fresh interpreter would.
PRELOAD = (
    "cloudtrain.cli.main", "cloudtrain.cli.run", "cloudtrain.cli.cluster", "cloudtrain.cli.recipe",
    "cloudtrain.cli.check", "cloudtrain.cli.gc", "cloudtrain.cli.recipes", "cloudtrain.cli.sweep",
    "cloudtrain.cli.catalog", "cloudtrain.cli.autostop", "cloudtrain.cli.plan", "cloudtrain.cli.cost",
    "cloudtrain.cli.driver", "cloudtrain.cli.compare", "cloudtrain.cli.events", "cloudtrain.cli.report",
    "cloudtrain.cli.team", "cloudtrain.config", "cloudtrain.recipe", "cloudtrain.run.pipeline",
    "cloudtrain.run.recover", "cloudtrain.cluster.lifecycle", "cloudtrain.cluster.gc", "cloudtrain.sweep.session",
    "cloudtrain.providers.aws", "cloudtrain.providers.gcp", "cloudtrain.providers.azure",
    "cloudtrain.providers.ssh", "cloudtrain.providers.local", "cloudtrain.providers.slurm",
    "boto3", "botocore.session", "google.auth", "google.auth.transport.requests", "google.oauth2.service_account",
    "google.api_core.exceptions", "google.cloud.compute_v1", "azure.identity", "azure.mgmt.compute",
    "azure.mgmt.network", "azure.mgmt.resource", "azure.storage.blob", "psycopg2", "optuna",
)


# What a fresh interpreter reads from the environment at its start, before any of our code: a
# call whose environment sets these otherwise than the server's is started as a subprocess.
STARTUP_ENV = ("PYTHONPATH", "PYTHONHOME", "PYTHONSAFEPATH", "PYTHONNOUSERSITE", "PYTHONUSERBASE",
               "PYTHONPLATLIBDIR", "PYTHONUNBUFFERED", "PYTHONIOENCODING", "PYTHONUTF8", "PYTHONLEGACYWINDOWSSTDIO",
               "PYTHONHASHSEED", "PYTHONWARNINGS", "PYTHONDEVMODE", "PYTHONMALLOC", "PYTHONFAULTHANDLER",
               "PYTHONTRACEMALLOC", "PYTHONOPTIMIZE", "PYTHONINSPECT", "PYTHONVERBOSE", "PYTHONPROFILEIMPORTTIME",
               "PYTHONNODEBUGRANGES", "PYTHONINTMAXSTRDIGITS", "PYTHONBREAKPOINT", "PYTHONSTARTUP")


def enabled() -> bool:
    return os.environ.get(ENABLE_ENV, "1") != "0" and hasattr(os, "fork") and hasattr(socket, "AF_UNIX")


# the server ---------------------------------------------------------------------------------------

def _preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:
            continue  # an extra not installed: the child will say so as a fresh interpreter would


def _recv_request(conn: socket.socket) -> tuple[dict, list[int]]:
    """One JSON request line with its three fds (stdin, stdout, stderr)."""
    fds = array.array("i")
    data = b""
    while not data.endswith(b"\n"):
        chunk, ancdata, _, _ = conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
        if not chunk:
            raise EOFError("the caller went away before its request was whole")
        data += chunk
        for level, kind, payload in ancdata:
            if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                fds.frombytes(payload[:len(payload) - len(payload) % fds.itemsize])
    return json.loads(data), list(fds)


def _become_the_cli(request: dict, fds: list[int]) -> None:
    """In the forked child: the caller's process, as `python -m cloudtrain` would start it."""
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2):
        signal.signal(sig, signal.SIG_DFL)
    signal.set_wakeup_fd(-1)
    # A fresh interpreter installs KeyboardInterrupt unless SIGINT came in ignored.
    signal.signal(signal.SIGINT, signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler)
    signal.pthread_sigmask(signal.SIG_SETMASK, [])
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in fds:
        if fd > 2:
            os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    tempfile.tempdir = None  # gettempdir() reads this process's TMPDIR again
    sys.path[0] = os.getcwd()  # `-m` puts the working directory first
    sys.argv = ["-m", *request["argv"]]


def serve(listener: socket.socket, parent_alive: int) -> dict | None:
    """Fork one CLI per request until the caller closes `parent_alive`. Returns only in a child:
    the request it is to run."""
    children: dict[int, socket.socket] = {}
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # the wakeup fd is what matters
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(parent_alive, selectors.EVENT_READ, "parent")
    sel.register(wake_r, selectors.EVENT_READ, "child")
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                for conn in children.values():
                    conn.close()
                return None
            if key.data == "child":
                try:
                    os.read(wake_r, 4096)
                except BlockingIOError:
                    pass  # drained by an earlier wakeup
                while children:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                    if pid == 0:
                        break
                    conn = children.pop(pid, None)
                    if conn is not None:
                        try:
                            conn.sendall(f"exit {os.waitstatus_to_exitcode(status)}\n".encode())
                        except OSError:
                            pass  # the caller gave up on it (its timeout): nobody to tell
                        conn.close()
                continue
            conn, _ = listener.accept()
            try:
                request, fds = _recv_request(conn)
            except (EOFError, OSError, ValueError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                sel.close()
                listener.close()
                conn.close()
                for other in children.values():
                    other.close()
                os.close(wake_r)
                os.close(wake_w)
                os.close(parent_alive)
                _become_the_cli(request, fds)
                return request
            for fd in fds:
                os.close(fd)
            children[pid] = conn
            conn.sendall(f"pid {pid}\n".encode())


def main() -> None:
    path, parent_alive = sys.argv[1], int(sys.argv[2])
    _preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    # What is imported stays as it is: no collection in any child walks it, nor its exit (a
    # collection over the whole heap at each child's exit took 1.9 s).
    gc.freeze()
    print("ready", flush=True)
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)  # the child's stdout is the caller's, never ours
    os.close(null)
    if serve(listener, parent_alive) is None:
        return
    os._exit(_run_the_cli())


def _run_the_cli() -> int:
    """`python -m cloudtrain` to the end of what its exit does: its exit status. The interpreter's
    own finalization (tearing down 2,000 modules, 0.25 s) is skipped; what a program sees of its
    exit is kept, in the interpreter's order: non-daemon threads joined, atexit handlers, the
    standard streams flushed (a flush that fails makes it 120), an uncaught Ctrl-C ends it by
    SIGINT."""
    import runpy
    import traceback

    code = 0
    interrupted = False
    try:
        runpy.run_module("cloudtrain", run_name="__main__", alter_sys=True)
    except SystemExit as exc:
        if exc.code is None:
            code = 0
        elif isinstance(exc.code, int):
            code = exc.code
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        interrupted = True
    except BaseException:  # noqa: BLE001  (what the interpreter prints for an uncaught exception)
        sys.excepthook(*sys.exc_info())
        code = 1
    threading._shutdown()  # type: ignore[attr-defined]  (what Py_FinalizeEx calls first)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            code = code or 120
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return code & 0xFF


# the caller ---------------------------------------------------------------------------------------

@dataclass
class _Server:
    proc: subprocess.Popen
    path: str
    alive_w: int
    startup: dict[str, str | None]  # its STARTUP_ENV


_server: _Server | None = None
_server_lock = threading.Lock()


def _start() -> _Server:
    where = tempfile.mkdtemp(prefix="ct-forkcli-")
    path = os.path.join(where, "sock")
    alive_r, alive_w = os.pipe()
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain.testing.forkcli", path, str(alive_r)],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=None,
                            pass_fds=(alive_r,), cwd=where, env=dict(os.environ), text=True)
    os.close(alive_r)
    atexit.register(stop_server)
    ready = proc.stdout.readline() if proc.stdout is not None else ""
    if ready.strip() != "ready":
        proc.kill()
        proc.wait()
        raise RuntimeError(f"the CLI fork server did not start (exit {proc.poll()})")
    return _Server(proc, path, alive_w, {name: os.environ.get(name) for name in STARTUP_ENV})


def _server_now() -> _Server:
    global _server
    with _server_lock:
        if _server is None or _server.proc.poll() is not None:
            _server = _start()
        return _server


def stop_server() -> None:
    """End this process's server (its children, the CLIs, are not touched: each ends on its own)."""
    global _server
    with _server_lock:
        if _server is None:
            return
        os.close(_server.alive_w)
        try:
            _server.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _server.proc.kill()
            _server.proc.wait()
        if _server.proc.stdout is not None:
            _server.proc.stdout.close()
        Path(_server.path).unlink(missing_ok=True)
        Path(_server.path).parent.rmdir()
        _server = None


def _sigint_default() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def cli(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | Path, input: str | None = None,
        timeout: float | None = None, default_sigint: bool = False) -> subprocess.CompletedProcess:
    """`python -m cloudtrain ARGV`, captured: forked from this process's server (`run`), or a
    plain subprocess when `CLOUDTRAIN_TEST_FORK_CLI=0` turned that off."""
    if enabled():
        return run(argv, env=env, cwd=cwd, input=input, timeout=timeout, default_sigint=default_sigint)
    return _subprocess(argv, env, cwd, input, timeout, default_sigint)


def _subprocess(argv: Sequence[str], env: Mapping[str, str], cwd: str | Path, input: str | None,
                timeout: float | None, default_sigint: bool) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cloudtrain", *map(str, argv)], env=dict(env), cwd=str(cwd),
                          input=input, stdin=subprocess.DEVNULL if input is None else None,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          preexec_fn=_sigint_default if default_sigint else None)


def run(argv: Sequence[str], *, env: Mapping[str, str], cwd: str | Path, input: str | None = None,
        timeout: float | None = None, default_sigint: bool = False) -> subprocess.CompletedProcess:
    """`python -m cloudtrain ARGV` as subprocess.run(..., capture_output=True, text=True) runs it
    (stdin: `input`, or nothing). `default_sigint`: Ctrl-C works in it even if it is ignored here,
    as a preexec_fn resetting SIGINT gives a subprocess."""
    server = _server_now()
    if any(env.get(name) != value for name, value in server.startup.items()):
        return _subprocess(argv, env, cwd, input, timeout, default_sigint)
    stdin_r = os.open(os.devnull, os.O_RDONLY) if input is None else None
    in_r, in_w = os.pipe() if input is not None else (stdin_r, -1)
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    request = {"argv": [str(a) for a in argv], "env": dict(env), "cwd": str(cwd),
               "sigint_ignored": not default_sigint and signal.getsignal(signal.SIGINT) is signal.SIG_IGN}
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(server.path)
        conn.sendmsg([json.dumps(request).encode() + b"\n"],
                     [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [in_r, out_w, err_w]))])
    finally:
        for fd in (in_r, out_w, err_w):
            os.close(fd)
    reader = conn.makefile("r")
    first = reader.readline().split()
    if first[:1] != ["pid"]:
        for fd in (out_r, err_r, in_w):
            if fd >= 0:
                os.close(fd)
        conn.close()
        raise RuntimeError(f"the CLI fork server did not start {list(argv)!r}")
    pid = int(first[1])
    out: list[bytes] = []
    err: list[bytes] = []

    def drain(fd: int, into: list[bytes]) -> None:
        with os.fdopen(fd, "rb") as stream:
            into.append(stream.read())

    readers = [threading.Thread(target=drain, args=(out_r, out), daemon=True),
               threading.Thread(target=drain, args=(err_r, err), daemon=True)]
    for thread in readers:
        thread.start()
    if in_w >= 0:
        def feed() -> None:
            with os.fdopen(in_w, "wb") as stream:
                try:
                    stream.write((input or "").encode())
                except BrokenPipeError:
                    pass  # the CLI did not read it all, as subprocess.run allows

        threading.Thread(target=feed, daemon=True).start()
    deadline = None if timeout is None else time.monotonic() + timeout
    conn.settimeout(timeout)
    try:
        line = reader.readline()
    except TimeoutError:
        # As subprocess.run: killed, then the timeout raised with what it had written.
        os.kill(pid, signal.SIGKILL)
        conn.close()
        for thread in readers:
            thread.join(5)
        raise subprocess.TimeoutExpired([sys.executable, "-m", "cloudtrain", *argv], timeout or 0,
                                        b"".join(out), b"".join(err)) from None
    conn.close()
    if not line.startswith("exit "):
        raise RuntimeError(f"the CLI fork server lost {list(argv)!r}")
    for thread in readers:
        # As subprocess.run: the output to its end, which a process the CLI left behind may hold.
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
    return subprocess.CompletedProcess([sys.executable, "-m", "cloudtrain", *argv], int(line.split()[1]),
                                       b"".join(out).decode(errors="replace"), b"".join(err).decode(errors="replace"))


if __name__ == "__main__":
    main()
