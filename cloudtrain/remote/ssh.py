"""SSHTransport: the Transport contract over one paramiko connection per node.

Every command goes over the same connection (no per-command handshake), through the node helper
(remote/helper.py: one session for all commands, one round trip each, several sent together
answered together) or, where the node has no python3 or another thread holds the helper, on an
exec channel of its own. Round trips are counted (remote/roundtrips.py). The
connection is re-opened transparently when it dropped between calls; a drop DURING a command
raises ConnectionLostError, because only the caller knows whether the command is safe to repeat
(`read_log` with an offset is, `submit` is not).

Routing: a ProxyCommand (recipe host or config.ssh.proxy_command, OpenSSH %h %p %r tokens) runs
with one end of a socketpair as its stdin/stdout, exactly like OpenSSH does it. That is how a
bastion is used, and how tests map a fake cloud address to a loopback sshd without sending a
packet to that address. Opening, reusing and re-opening the connection: remote/sshconnect.py.
"""

from __future__ import annotations

import logging
import os
import shlex
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from cloudtrain.config import Config
from cloudtrain.errors import RemoteCommandError, RemoteError
from cloudtrain.providers.base import HostSpec, Instance
from cloudtrain.remote.archive import (
    Extracted,
    list_files,
    list_files_argv,
    list_present,
    parse_file_listing,
    safe_extract,
    tar_newer_argv,
)
from cloudtrain.remote.channel import (
    ConnectionLostError,
    InputSource,
    RemoteProcess,
    SSHAuthError,
    SSHConnectError,
    reader,
    transfer_errors,
)
from cloudtrain.remote import gone, homecache, muxkeep, muxlink
from cloudtrain.remote.helper import HelperProcess, HelperUnavailable, NodeHelper, NotDelivered
from cloudtrain.remote.keys import Endpoint, KnownHosts, node_config, resolve_endpoint
from cloudtrain.remote.roundtrips import RoundTrips, log_report
from cloudtrain.remote.sshconnect import Connecting
from cloudtrain.remote.transport import CommandResult, SyncStats

if TYPE_CHECKING:
    import paramiko

    from cloudtrain.remote.connection import Connection

log = logging.getLogger(__name__)
# paramiko logs socket errors it also raises, and we turn those into typed errors with hints; a
# library must not print them through logging's last-resort handler. An application that
# configures logging (e.g. the CLI's --debug) still receives them.
logging.getLogger("paramiko").addHandler(logging.NullHandler())

# Re-opening a connection that dropped between calls: a blip, not a boot; don't wait minutes.
_RECONNECT_BUDGET_S = 30.0
# A freshly launched VM may accept TCP before cloud-init installed our key: retry auth that long.
BOOT_GRACE_S = 900.0
# A node up for longer than that is not booting: retry a blip, not a boot.
_WARM_RETRY_S = 10.0
# CLOUDTRAIN_SSH_HELPER=0: every command on its own exec channel (how benchmarks compare the two).
HELPER_ENV = "CLOUDTRAIN_SSH_HELPER"
# Overrides ssh.persist_s (seconds a node's connection is kept after a command; 0: not kept).
PERSIST_ENV = "CLOUDTRAIN_SSH_PERSIST_S"

__all__ = ["ConnectionLostError", "SSHAuthError", "SSHConnectError", "SSHTransport", "open_transport"]

def open_transport(
    *,
    cluster: str,
    instance: Instance,
    config: Config,
    host: HostSpec | None = None,
    key_path: Path | None = None,
    known_hosts: KnownHosts | None = None,
) -> SSHTransport:
    """Connect to a node. A machine we created may still be booting (launched or started in the
    last 15 minutes): retry with backoff for up to config.ssh.connect_retries_s. One that has been
    up for an hour and does not answer is down: retry briefly. A `host` is the user's own machine,
    which exists already and never boots because of us: one attempt, so a mistyped address fails
    in about connect_timeout_s with what went wrong (unreachable, refused, auth, host key)."""
    endpoint = resolve_endpoint(instance=instance, config=config, host=host, key_path=key_path)
    retries = config.ssh.connect_retries_s
    fresh = instance.launched_at is not None and time.time() - instance.launched_at < BOOT_GRACE_S
    if host is not None:
        retry_for, retry_auth = 0.0, False
    elif fresh:
        retry_for, retry_auth = retries, True
    else:
        retry_for, retry_auth = min(retries, _WARM_RETRY_S), False
    transport = SSHTransport(
        endpoint,
        cluster=cluster,
        known_hosts=known_hosts or KnownHosts(),
        connect_timeout=config.ssh.connect_timeout_s,
        retry_for=retry_for,
        retry_auth=retry_auth,
        # A link that drops between two commands is a blip on any machine, booting or not.
        reconnect_for=min(retries, _RECONNECT_BUDGET_S),
        persist_s=persist_seconds(config),
    )
    transport.connect()
    return transport


def persist_seconds(config: Config) -> float:
    raw = os.environ.get(PERSIST_ENV)
    if raw is None:
        return config.ssh.persist_s
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 86400:  # NaN fails too
        raise RemoteError(f"{PERSIST_ENV}={raw!r} is not a number of seconds from 0 to 86400")
    return value


class SSHTransport(Connecting):
    """Transport to one node over SSH. Thread-safe: channels may run from several threads."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        cluster: str,
        known_hosts: KnownHosts,
        connect_timeout: float = 10.0,
        retry_for: float = 0.0,
        retry_auth: bool = False,
        reconnect_for: float | None = None,
        persist_s: float = 0.0,
    ) -> None:
        self.endpoint = endpoint
        self.cluster = cluster
        self.known_hosts = known_hosts
        self.connect_timeout = connect_timeout
        self.retry_for = retry_for
        self.retry_auth = retry_auth
        self.reconnect_for = min(retry_for, _RECONNECT_BUDGET_S) if reconnect_for is None else reconnect_for
        self.connects = 0  # how many connections were opened (1 + reconnects)
        self._conn: Connection | None = None
        self._lock = threading.RLock()
        self._home: str | None = None
        self._commands: dict[str, bool] = {}
        self.round_trips = RoundTrips()
        self._helper: NodeHelper | None = None
        self._helper_off = os.environ.get(HELPER_ENV, "1") == "0"
        # Set by give_up() from another thread (the node is known gone): ends a reconnect loop
        # between attempts without its lock, which that loop holds.
        self._given_up = threading.Event()
        # Connection reuse (remote/muxlink.py): the node's mux, when one served this transport,
        # and how the connection came ("mux", "process": parked by an earlier transport, "").
        self.persist_s = persist_s
        self.learn_host_keys = True  # False: a node without a pinned key is refused (remote/mux.py)
        self._link: muxlink.MuxLink | None = None
        self.reused = ""
        gone.track(self)  # the recovery watcher may make it give up before anyone holds it

    # ------------------------------------------------------------------ Transport contract

    @property
    def label(self) -> str:
        return self.endpoint.label

    @property
    def home(self) -> str:
        if self._home is None:
            # A home remembered from an earlier hello lets the first request go with the helper's start.
            remembered = None if self._helper is not None else homecache.get(self.endpoint.instance_id,
                                                                             self.endpoint.user)
            helper = self._helper_now(assumed_home=remembered)
            if helper is not None and helper.home.startswith("/"):
                self._home = helper.home
                return self._home
            text = self.run(["sh", "-c", 'printf %s "${HOME:-$(pwd)}"']).text.strip()
            if not text.startswith("/"):
                raise RemoteError(f"{self.label}: could not determine the home directory (got {text!r})")
            self._home = text
        return self._home

    def run(
        self,
        argv: Sequence[str],
        *,
        input: InputSource | None = None,
        timeout: float | None = None,
        check: bool = True,
        what: str | None = None,
    ) -> CommandResult:
        """Run argv (quoted for a POSIX shell) on the node. `input` may be bytes or a binary file.

        `what` names the operation in errors ("copying the results"); default: running argv[0].
        """
        args = [str(a) for a in argv]
        doing = what or f"running {args[0]!r}"
        helper = self._helper_now()
        if helper is not None:
            try:
                try:
                    return self._run_helper(helper, args, input, timeout, check, doing)
                except NotDelivered:
                    # The link had dropped before the request was out (between two calls): it did
                    # not run, so once more on a fresh connection, as a channel that failed to open.
                    helper = self._helper_now()
                    if helper is None:
                        raise
                    return self._run_helper(helper, args, input, timeout, check, doing)
            except HelperUnavailable as exc:
                # It never started, so nothing ran: this command (and the next) on a channel of its own.
                log.info("%s: %s; one channel per command", self.label, exc.message)
                self._helper, self._helper_off = None, True
        command = shlex.join(args)
        remote_limit = timeout is not None and self.has_command("timeout")
        if remote_limit:
            # Closing our channel does not stop the remote process, and until it exits it holds
            # one of sshd's MaxSessions slots: the node enforces the limit (exit code 124), our
            # own deadline, a little later, covers a silent network.
            command = shlex.join(["timeout", "-k", "2", f"{timeout:g}", *args])
        started = time.monotonic()
        proc = self._start_channel(command, input=input, timeout=None if timeout is None else timeout + 3,
                                   what=doing)
        try:
            stdout = proc.read_all()
            code = proc.wait()
        finally:
            proc.close()
        if remote_limit and code in (124, 137) and time.monotonic() - started >= timeout:  # type: ignore[operator]
            raise RemoteError(f"{self.label}: {doing} timed out after {timeout}s")
        result = CommandResult(tuple(args), code, stdout, proc.stderr)
        if check and code != 0:
            raise RemoteCommandError(args, code, proc.stderr.decode(errors="replace"))
        return result

    def _run_helper(self, helper: NodeHelper, args: list[str], input: InputSource | None, timeout: float | None,
                    check: bool, doing: str) -> CommandResult:
        # The helper enforces the timeout on the node (exit code 124, as timeout(1) says).
        started = time.monotonic()
        proc = helper.submit(args, input=input, timeout=timeout, what=doing)
        try:
            stdout = proc.read_all()
            code = proc.wait()
        finally:
            proc.close()
        if timeout is not None and code == 124 and time.monotonic() - started >= timeout:
            raise RemoteError(f"{self.label}: {doing} timed out after {timeout}s")
        result = CommandResult(tuple(args), code, stdout, proc.stderr)
        if check and code != 0:
            raise RemoteCommandError(args, code, proc.stderr.decode(errors="replace"))
        return result

    def run_helper_op(self, op: str, root: str, input: bytes, source: str) -> bytes:
        """A sync_helper.py one-shot operation (manifest, verify): in the node helper's own process
        when there is one (no interpreter to start), else `python3 -c source op root`."""
        helper = self._helper_now()
        if helper is not None:
            proc = helper.submit_op(op, root, input, what=f"{op} of {root}")
            try:
                stdout = proc.read_all()
                code = proc.wait()
            finally:
                proc.close()
            if code != 0:
                raise RemoteCommandError(["sync_helper", op, root], code, proc.stderr.decode(errors="replace"))
            return stdout
        return self.run(["python3", "-c", source, op, root], input=input).stdout

    def stream(self, argv: Sequence[str], *, what: str | None = None) -> Iterator[bytes]:
        args = [str(a) for a in argv]
        doing = what or f"running {args[0]!r}"
        helper = self._helper_now()
        proc = helper.submit(args, what=doing) if helper is not None else self.start(shlex.join(args), what=doing)
        try:
            while chunk := proc.read():
                yield chunk
            code = proc.wait()
        finally:
            proc.close()
        if code != 0:
            raise RemoteCommandError(args, code, proc.stderr.decode(errors="replace"))

    # mktemp creates the temp file 0600, so a secret is never readable by others, and the rename
    # makes the new content appear whole or not at all.
    _PUT_FILE = (
        'd=$(dirname -- "$1") && mkdir -p -- "$d" && t=$(mktemp "$d/.ct-put.XXXXXX") || exit 1; '
        'if cat > "$t" && chmod "$2" "$t" && mv -f -- "$t" "$1"; then exit 0; fi; rm -f -- "$t"; exit 1'
    )

    def put_file(self, data: bytes, remote_path: str, mode: int = 0o644) -> None:
        self.run(["sh", "-c", self._PUT_FILE, "sh", remote_path, format(mode, "o")], input=data,
                 what=f"writing {remote_path.rsplit('/', 1)[-1]}")

    def start_put_file(self, data: bytes, remote_path: str, mode: int = 0o644) -> RemoteProcess | HelperProcess:
        """put_file, sent now (start's rules: read the answer in order; exit 0 when written)."""
        return self.start(shlex.join(["sh", "-c", self._PUT_FILE, "sh", remote_path, format(mode, "o")]), input=data,
                          what=f"writing {remote_path.rsplit('/', 1)[-1]}")

    def put_tree(self, local: Path, remote_dir: str, *, ignore: Callable[[str], bool] | None = None,
                 new_dir: bool = False) -> SyncStats:
        from cloudtrain.remote.sync import sync_tree

        return sync_tree(self, local, remote_dir, ignore, new_dir=new_dir)

    def get_tree(self, remote_dir: str, paths: Sequence[str], local: Path,
                 newer_than: str | None = None) -> Extracted:
        """Stream a tar of `paths` from the node straight into safe_extract (never buffered whole).

        A link that drops mid-stream raises ConnectionLostError (never a bare EOFError or a
        "truncated archive" that hides the cause) and leaves `local` untouched.
        """
        if newer_than is not None:
            # Only what this run wrote (files modified after its job started), chosen on the node.
            argv = tar_newer_argv(remote_dir, paths, newer_than)
        else:
            present = list_present(self, remote_dir, paths)
            if not present:
                return Extracted()
            argv = ["tar", "-C", remote_dir, "-cf", "-", "--", *present]
        return self._extract(self.start(shlex.join(argv), what="copying the results"), local, argv)

    def _extract(self, proc: RemoteProcess | HelperProcess, local: Path, argv: Sequence[str]) -> Extracted:
        try:
            try:
                extracted = safe_extract(reader(proc), local)
                proc.read_all()  # trailing zero blocks after the end-of-archive marker
                code = proc.wait()
            except ConnectionLostError:
                raise
            except RemoteError as exc:
                # tarfile saw the stream end early: say why when the link is what broke.
                if not proc.conn.alive():
                    raise self._lost("copying the results", proc.conn.exception()) from None
                raise exc from None
        finally:
            proc.close()
        # GNU tar exits 1 when a file changed while it was read (a job still writing): the archive
        # is complete and valid, so keep it and say so.
        if code == 1:
            log.warning("%s: tar reported files changing during the copy: %s", self.label, proc.stderr_tail())
        elif code != 0:
            raise RemoteCommandError(argv, code, proc.stderr.decode(errors="replace"))
        return extracted

    def get_tree_listed(self, remote_dir: str, paths: Sequence[str], local: Path,
                        newer_than: str | None = None) -> tuple[dict[str, int], Extracted]:
        """list_files and get_tree asked together (one round trip through the node helper): the
        listing the caller checks the copy against, then the copy. Listed first, so a file that
        appears between the two is extra, never missing."""
        if self._helper_now() is None:
            return list_files(self, remote_dir, paths, newer_than), self.get_tree(remote_dir, paths, local, newer_than)
        listing_argv = list_files_argv(remote_dir, paths, newer_than)
        lister = self.start(shlex.join(listing_argv), what="listing the results")
        if newer_than is None:
            # Which paths exist is only known from the listing's command: the plain copy follows it.
            try:
                listing = lister.read_all()
                code = lister.wait()
            finally:
                lister.close()
            if code != 0:
                raise RemoteCommandError(listing_argv, code, lister.stderr.decode(errors="replace"))
            return parse_file_listing(listing), self.get_tree(remote_dir, paths, local, newer_than)
        copier = self.start(shlex.join(tar_newer_argv(remote_dir, paths, newer_than)), what="copying the results")
        try:
            listing = lister.read_all()
            code = lister.wait()
        except BaseException:
            copier.close()
            raise
        finally:
            lister.close()
        if code != 0:
            copier.close()
            raise RemoteCommandError(listing_argv, code, lister.stderr.decode(errors="replace"))
        return parse_file_listing(listing), self._extract(copier, local, tar_newer_argv(remote_dir, paths, newer_than))

    def give_up(self) -> None:
        """The node is gone (the cloud says so): a reconnect loop in progress ends after its current
        attempt, and every later connect fails at once. Safe from any thread."""
        self.retry_for = 0.0
        self.reconnect_for = 0.0
        # An address the cloud already gave back may still accept and never speak: don't wait on it.
        self.connect_timeout = min(self.connect_timeout, 1.0)
        self._given_up.set()

    def close(self) -> None:
        """Close, or park the connection with its idle node helper for the next command
        (ssh.persist_s > 0: remote/muxlink.py); the mux's helper stream is closed either way."""
        with self._lock:
            helper, self._helper = self._helper, None
            link, self._link = self._link, None
            conn, self._conn = self._conn, None
            if self.connects or self.reused:
                report = self.round_trips.report(self.label, self.connects, self.reused)
                log.debug("%s: round trips %s", self.label, report)
                log_report(report)
            if helper is not None and (link is not None or not helper.idle):
                helper.discard()
                helper = None
            if link is not None:
                link.close()
            if conn is not None and muxkeep.release(self.mux_spec(), conn):
                if helper is not None:
                    helper.discard()  # another transport of this process still uses the connection
            elif conn is not None:
                kept = not self._given_up.is_set() and muxkeep.park(self.mux_spec(), conn, helper)
                if not kept:
                    if helper is not None:
                        helper.discard()
                    conn.close()

    def __enter__(self) -> SSHTransport:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ extras used by sync and lifecycle

    def has_command(self, name: str) -> bool:
        """Whether `name` is on the node's PATH (cached per transport)."""
        if name not in self._commands:
            helper = self._helper_now()
            if helper is not None:
                helper.ensure_hello()
            if helper is not None and name in helper.commands:
                self._commands[name] = helper.commands[name]
                return self._commands[name]
            result = self.run(["sh", "-c", 'command -v "$1" >/dev/null 2>&1', "sh", name], check=False, timeout=None)
            self._commands[name] = result.exit_code == 0
        return self._commands[name]

    def openssh_command(self) -> list[str]:
        """argv for OpenSSH reaching this node with the same key, proxy and pinned host key.

        The host to name on the command line is `ct-node`; e.g. rsync -e "<this>" ct-node:/path.
        """
        return ["ssh", "-F", str(node_config(self.endpoint, self.known_hosts, connect_timeout=self.connect_timeout))]

    def start(
        self, command: str, *, input: InputSource | None = None, timeout: float | None = None, what: str = ""
    ) -> RemoteProcess | HelperProcess:
        """Start a raw shell command; the caller reads, waits and closes. Through the helper nothing
        is awaited here: commands started one after the other before any is read go to the node
        together (one round trip for all), and must then be read in the order they were started."""
        helper = self._helper_now()
        if helper is not None:
            # `timeout` here is the caller's own deadline (as for a channel), not the node's.
            proc = helper.submit(["sh", "-c", command], input=input, what=what or command.split(" ", 1)[0])
            if timeout is not None:
                proc.timeout, proc.deadline = timeout, time.monotonic() + timeout
            return proc
        return self._start_channel(command, input=input, timeout=timeout, what=what)

    def helper_for_check(self) -> Callable[..., HelperProcess] | None:
        """The node helper's one-shot operations (remote/sync.start_unchanged_check), None without one."""
        helper = self._helper_now()
        return None if helper is None else helper.submit_op

    def only_if(self, procs: Sequence[HelperProcess]) -> None:
        """Until called again, requests this thread starts run on the node only if each of `procs`
        (started earlier through the node helper) exited 0; otherwise the node skips them (code
        helper.SKIPPED, nothing ran). How exec sends its job's start with the checks it depends on."""
        helper = self._helper_now()
        if helper is not None:
            helper.after = tuple(procs)

    def pipelining(self) -> bool:
        """Whether commands started now go through the node helper, so they run in the order they
        were started and a later one may be sent before an earlier one's answer (remote/jobs.py)."""
        return self._helper_now() is not None

    def _helper_now(self, assumed_home: str | None = None) -> NodeHelper | None:
        """The node helper for this thread, started on first use; None: use a channel of its own
        (the node has no python3, helpers are off, or another thread's requests are in flight)."""
        if self._helper_off:
            return None
        me = threading.get_ident()
        with self._lock:
            helper = self._helper
            if helper is not None and helper.usable_by(me):
                return helper
            if helper is not None and helper.alive:
                return None
            if self._link is not None:
                helper = self._mux_helper()
                if helper is not None:
                    return helper
            conn, chan = self._open_channel()
            try:
                self._helper = NodeHelper.start(
                    self.label, conn, chan, self.round_trips, self.connect_timeout + 10, assumed_home=assumed_home,
                    on_hello=lambda home: homecache.put(self.endpoint.instance_id, self.endpoint.user, home))
            except HelperUnavailable as exc:
                log.info("%s: %s; one channel per command", self.label, exc.message)
                self._helper, self._helper_off = None, True
                return None
            return self._helper

    def _mux_helper(self) -> NodeHelper | None:
        """A node helper the mux started ahead; None (and the mux is dropped): connect ourselves."""
        assert self._link is not None
        got = self._link.helper_channel()
        if got is not None:
            chan, fresh = got
            if fresh:  # the mux had none ready and opened the channel while we waited
                self.round_trips.session()
                self.round_trips.sent()
                self.round_trips.waiting("channel open (mux)")
            try:
                self._helper = NodeHelper.attach(
                    self.label, self._link, chan, self.round_trips, self.connect_timeout + 10,  # type: ignore[arg-type]
                    on_hello=lambda home: homecache.put(self.endpoint.instance_id, self.endpoint.user, home))
                return self._helper
            except (HelperUnavailable, ConnectionLostError) as exc:
                log.debug("%s: the mux's helper: %s", self.label, exc.message)
        self._link.close()
        self._link, self.reused = None, ""
        return None

    def _start_channel(
        self, command: str, *, input: InputSource | None = None, timeout: float | None = None, what: str = ""
    ) -> RemoteProcess:
        conn, chan = self._open_channel()
        try:
            self.round_trips.sent()
            self.round_trips.waiting(f"exec {what or command.split(' ', 1)[0]}")
            chan.exec_command(command)
        except transfer_errors() as exc:
            chan.close()
            # The request may have reached the node: the command's fate is unknown.
            raise self._lost(f"starting {what or command.split(' ', 1)[0]!r}", exc) from None
        proc = RemoteProcess(self.label, conn, chan, what or f"running {command.split(' ', 1)[0]!r}", timeout,
                             self.round_trips)
        if input is not None:
            proc.feed(input)
        else:
            chan.shutdown_write()
        return proc
