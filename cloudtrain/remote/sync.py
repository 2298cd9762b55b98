"""Moving a local tree to a node, sending only what changed.

Two methods, same result (the file list is ours either way, so ignore rules match exactly):
  rsync      when both ends have rsync: `rsync --files-from` over OpenSSH configured with the
             transport's key, proxy and PINNED host key (a generated `ssh -F` file).
  tar-delta  otherwise: the node reports size+mtime of our files (templates/sync_helper.py, or
             `find -printf` without python3); files whose size+mtime match are skipped; same size
             but different mtime are compared by sha256 on both ends; everything else goes in ONE
             tar stream over an exec channel.

Interrupted syncs are safe to repeat: rsync writes to a temp name and renames; a file that tar
left half-written has the wrong size or an mtime that fails the check, so the next run resends it.
Nothing on the node is deleted.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import shlex
import shutil
import stat
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from cloudtrain import paths
from cloudtrain.errors import RemoteCommandError, RemoteError
from cloudtrain.remote.transport import SyncStats

log = logging.getLogger(__name__)

LARGE_TREE_BYTES = 1 << 30
# A changed file at least this big that the node already has goes by rsync: its delta transfer
# sends only the edited blocks, where tar-delta would send the whole file again.
RSYNC_DELTA_BYTES = 8 << 20
# Same size, another mtime: up to this many bytes of such files are sent rather than compared by
# hash first (a round trip of 50 ms carries more than this on most links).
VERIFY_BYTES = 256 << 10
METHODS = ("auto", "rsync", "tar-delta")
_RSYNC_CONNECTION_CODES = {10, 12, 30, 35, 255}


class SyncError(RemoteError):
    """A sync did not complete; running it again resumes where it stopped."""


@dataclass(frozen=True)
class SyncReport(SyncStats):
    bytes_total: int = 0
    large: bool = False  # the tree is above the warning threshold (see LARGE_TREE_BYTES)
    seconds: float = 0.0


@dataclass(frozen=True)
class LocalEntry:
    rel: str  # posix path relative to the scan base
    size: int
    mtime: int
    link: str | None = None  # symlink target; links are sent as links, never followed


def local_mirror(source: Path, target: Path, *, ignore: Callable[[str], bool] | None = None) -> SyncStats:
    """Copy source into target, sending only files whose size or mtime changed."""
    total = sent = sent_bytes = 0
    target.mkdir(parents=True, exist_ok=True)
    if source.is_file():
        pairs = [(source, target / source.name)]
    else:
        pairs = []
        for dirpath, dirnames, filenames in os.walk(source):
            rel_dir = os.path.relpath(dirpath, source)
            dirnames[:] = [d for d in dirnames if not (ignore and ignore(os.path.normpath(os.path.join(rel_dir, d)) + "/"))]
            for name in filenames:
                rel = os.path.normpath(os.path.join(rel_dir, name))
                if ignore and ignore(rel):
                    continue
                pairs.append((Path(dirpath) / name, target / rel))
    for src, dst in pairs:
        total += 1
        st = src.stat()
        try:
            dt = dst.stat()
            if dt.st_size == st.st_size and int(dt.st_mtime) == int(st.st_mtime):
                continue
        except FileNotFoundError:
            pass
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dst)
        sent += 1
        sent_bytes += st.st_size
    return SyncStats(files_total=total, files_sent=sent, bytes_sent=sent_bytes, method="local-copy")


@dataclass(frozen=True)
class TreeScan:
    base: Path  # the directory the relative paths start from
    entries: tuple[LocalEntry, ...]  # what to send, sorted
    ignored: tuple[str, ...]  # what the ignore rules kept home: files, and pruned dirs ending in '/'
    single_file: bool = False


def scan_tree(local: Path, ignore: Callable[[str], bool] | None = None) -> TreeScan:
    """Walk local once, applying the ignore rules. A single file is sent as `<remote_dir>/<name>`."""
    local = Path(local)
    if not local.is_dir():
        st = local.stat()
        return TreeScan(local.parent, (LocalEntry(local.name, st.st_size, int(st.st_mtime)),), (), True)
    entries: list[LocalEntry] = []
    ignored: list[str] = []
    stack = [""]
    while stack:
        rel_dir = stack.pop()
        with os.scandir(local / rel_dir if rel_dir else local) as it:
            for item in it:
                rel = f"{rel_dir}{item.name}"
                st = item.stat(follow_symlinks=False)
                if stat.S_ISDIR(st.st_mode):
                    if ignore and ignore(rel + "/"):
                        ignored.append(rel + "/")
                    else:
                        stack.append(rel + "/")
                elif ignore and ignore(rel):
                    ignored.append(rel)
                elif stat.S_ISREG(st.st_mode):
                    entries.append(LocalEntry(rel, st.st_size, int(st.st_mtime)))
                elif stat.S_ISLNK(st.st_mode):
                    entries.append(LocalEntry(rel, st.st_size, int(st.st_mtime), os.readlink(item.path)))
                # sockets, fifos and devices have no meaning on another machine: skipped.
    entries.sort(key=lambda e: e.rel)
    return TreeScan(local, tuple(entries), tuple(sorted(ignored)))


def sync_tree(
    transport,  # noqa: ANN001 - any Transport; SSHTransport for the remote methods
    local: Path,
    remote_dir: str,
    ignore: Callable[[str], bool] | None = None,
    *,
    method: str = "auto",
    warn_bytes: int = LARGE_TREE_BYTES,
    new_dir: bool = False,
) -> SyncReport:
    """Make remote_dir hold local's files (a file: remote_dir/<name>); send only changes.
    `new_dir`: the caller saw remote_dir created empty in this command (a first `up`): the node
    is not asked what it has, a round trip that would list an empty directory. Always safe:
    sending a file the node has already only writes it again."""
    if method not in METHODS:
        raise ValueError(f"sync method must be one of {METHODS}, got {method!r}")
    started = time.monotonic()
    if not hasattr(transport, "openssh_command"):
        stats = local_mirror(Path(local), Path(remote_dir), ignore=ignore)
        return SyncReport(stats.files_total, stats.files_sent, stats.bytes_sent, stats.method,
                          seconds=time.monotonic() - started)
    return _sync_scanned(transport, scan_tree(Path(local), ignore), remote_dir, method, warn_bytes, started,
                         {} if new_dir else None)


def _sync_scanned(transport, scan: TreeScan, remote_dir: str, method: str, warn_bytes: int,  # noqa: ANN001
                  started: float, remote: dict[str, tuple] | None = None) -> SyncReport:
    base, entries = scan.base, list(scan.entries)
    total_bytes = sum(e.size for e in entries)
    large = total_bytes > warn_bytes
    if large:
        log.warning(
            "%s is %.1f GB to sync to %s; is that intended? Add what the job doesn't need to .cloudtrainignore",
            scan.base, total_bytes / 1e9, transport.label,
        )
    if method == "auto":
        # tar-delta is faster for new and small files (one stream on the open connection: 0.5x
        # rsync's time on a first sync of 5,000 files, 0.3x on a re-sync; docs/design/sync.md). rsync's
        # delta transfer wins only for large files with small edits: use it when such a file changed.
        if remote is None:
            remote = _remote_state(transport, str(remote_dir), entries)
        edited_large = any(
            e.link is None and e.size >= RSYNC_DELTA_BYTES and remote.get(e.rel, ("",))[0] == "f"
            and remote[e.rel][1:] != (e.size, e.mtime)
            for e in entries
        )
        method = "rsync" if edited_large and shutil.which("rsync") and transport.has_command("rsync") else "tar-delta"
    if method == "rsync":
        if not shutil.which("rsync"):
            raise SyncError("rsync is not installed on this machine", hint="install it, or use the tar-delta method")
        sent, sent_bytes = _sync_rsync(transport, scan, remote_dir)
    else:
        sent, sent_bytes = _sync_tar_delta(transport, base, entries, remote_dir, remote)
    return SyncReport(len(entries), sent, sent_bytes, method, total_bytes, large, time.monotonic() - started)


# ----------------------------------------------------------------------------- rsync


def _sync_rsync(transport, scan: TreeScan, remote_dir: str) -> tuple[int, int]:  # noqa: ANN001
    if not scan.entries:
        transport.run(["mkdir", "-p", "--", remote_dir])
        return 0, 0
    # rsync walks the tree itself (cheaper than feeding it --files-from) and skips exactly what
    # our scan ignored: each pruned directory and ignored file as an anchored, literal rule.
    # No -z: on the links we meet (same region, LAN, loopback) compressing many small files
    # costs more time than it saves, and datasets are usually compressed already.
    # --rsync-path creates remote_dir's parents in the same session (rsync makes only the last).
    if scan.single_file:
        source, selection = [str(scan.base / scan.entries[0].rel)], []
    else:
        source, selection = [f"{scan.base}/"], ["-r", "--from0", "--exclude-from=-"]
    argv = [
        "rsync", "-lpt", *selection, "--timeout=120", "--out-format=%i\t%l\t%n",
        "-e", shlex.join(transport.openssh_command()),
        f"--rsync-path=mkdir -p -- {shlex.quote(remote_dir)} && rsync",
        *source, f"ct-node:{remote_dir.rstrip('/')}/",
    ]
    rules = b"".join(os.fsencode(_literal_rule(rel)) + b"\0" for rel in scan.ignored)
    proc = subprocess.run(argv, input=rules, capture_output=True, env={**os.environ, "LC_ALL": "C"}, check=False)
    stderr = proc.stderr.decode(errors="replace").strip()
    if proc.returncode == 24:
        log.warning("%s: some files vanished while syncing: %s", transport.label, stderr.splitlines()[-1:])
    elif proc.returncode != 0:
        tail = stderr.splitlines()[-1] if stderr else f"exit code {proc.returncode}"
        lost = proc.returncode in _RSYNC_CONNECTION_CODES
        raise SyncError(
            f"rsync to {transport.label}:{remote_dir} failed: {tail}",
            hint="the connection dropped; running again resumes" if lost else "running again resumes",
        )
    return _count_itemized(proc.stdout.decode(errors="replace"))


def _literal_rule(rel: str) -> str:
    """An rsync exclude rule matching exactly this path from the transfer root."""
    # rsync reads `*?[` as wildcards, and a backslash as an escape only in a pattern that has one.
    if any(c in rel for c in "*?["):
        rel = re.sub(r"([*?\[\\])", r"\\\1", rel)
    return "/" + rel


def _count_itemized(text: str) -> tuple[int, int]:
    """Files and symlinks rsync sent or created, from `--out-format=%i<TAB>%l<TAB>%n` lines."""
    sent = sent_bytes = 0
    for line in text.splitlines():
        item, _, rest = line.partition("\t")
        # %i is YXcstpoguax: Y '<' = sent to the node, 'c' = created there; X 'f' file, 'L' symlink.
        if len(item) >= 2 and item[0] in "<c" and item[1] in "fL":
            sent += 1
            size = rest.partition("\t")[0]
            sent_bytes += int(size) if item[1] == "f" and size.isdigit() else 0
    return sent, sent_bytes


# ----------------------------------------------------------------------------- tar-delta


def _sync_tar_delta(transport, base: Path, entries: list[LocalEntry], remote_dir: str,  # noqa: ANN001
                    remote: dict[str, tuple] | None = None) -> tuple[int, int]:
    if remote is None:
        remote = _remote_state(transport, remote_dir, entries)
    changed: list[LocalEntry] = []
    ambiguous: list[LocalEntry] = []
    for entry in entries:
        have = remote.get(entry.rel)
        if entry.link is not None:
            if have != ("l", entry.link):
                changed.append(entry)
        elif have is None or have[0] != "f" or have[1] != entry.size:
            changed.append(entry)
        elif have[2] != entry.mtime:
            # Same size, different mtime (a fresh checkout, a `touch`): compare content.
            ambiguous.append(entry)
    if sum(e.size for e in ambiguous) <= VERIFY_BYTES:
        # Sending them costs less than the round trip that would compare them (an edit that kept
        # the size), and sets their mtime on the node just as a comparison would.
        changed += ambiguous
    else:
        changed += _differing(transport, base, remote_dir, ambiguous)
    if changed:
        _send_tar(transport, base, sorted(changed, key=lambda e: e.rel), remote_dir)
    return len(changed), sum(e.size for e in changed)


class UnchangedCheck:
    """A tree's sync, its check sent ahead: the node compares its files with what the laptop expects
    (one manifest, in the node helper) and exits 0 when nothing changed, so that requests sent
    `only_if` it (exec's job start) may run in the same round trip. `finish` reads the answer and,
    when something changed, sends what did (the manifest it got back is the one tar-delta uses)."""

    def __init__(self, transport, scan: TreeScan, remote_dir: str, proc) -> None:  # noqa: ANN001
        self.transport, self.scan, self.remote_dir, self.proc = transport, scan, remote_dir, proc
        self.started = time.monotonic()

    def finish(self) -> SyncReport:
        entries = list(self.scan.entries)
        try:
            data = self.proc.read_all()
            code = self.proc.wait()
        finally:
            self.proc.close()
        if code not in (0, 1):
            raise RemoteCommandError(["sync_helper", "manifest", self.remote_dir], code,
                                     self.proc.stderr.decode(errors="replace"))
        if code == 0:
            return SyncReport(len(entries), 0, 0, "tar-delta", sum(e.size for e in entries), False,
                              time.monotonic() - self.started)
        remote = _parse_manifest(self.transport.label, entries, data)
        return _sync_scanned(self.transport, self.scan, self.remote_dir, "auto", LARGE_TREE_BYTES, self.started, remote)


def start_unchanged_check(transport, local: Path, remote_dir: str,  # noqa: ANN001
                          ignore: Callable[[str], bool] | None = None) -> UnchangedCheck | None:
    """Send the check of UnchangedCheck now (nothing is awaited); None where the transport has no
    node helper to ask (then sync_tree as usual)."""
    helper = getattr(transport, "helper_for_check", None)
    submit = helper() if helper is not None else None
    if submit is None:
        return None
    scan = scan_tree(Path(local), ignore)
    pairs = b"".join(os.fsencode(e.rel) + b"\0" + _expected_record(e) + b"\0" for e in scan.entries)
    return UnchangedCheck(transport, scan, remote_dir, submit("manifest", remote_dir, pairs,
                                                              what=f"checking {remote_dir}", expect=True))


def _expected_record(entry: LocalEntry) -> bytes:
    """The manifest record (templates/sync_helper.py) of the node's copy of an entry when in sync."""
    if entry.link is not None:
        return b"l " + os.fsencode(entry.link)
    return b"f %d %d" % (entry.size, entry.mtime)


def _remote_state(transport, remote_dir: str, entries: list[LocalEntry]) -> dict[str, tuple]:  # noqa: ANN001
    if not entries:
        return {}
    if transport.has_command("python3"):
        names = b"\0".join(os.fsencode(e.rel) for e in entries) + b"\0"
        return _parse_manifest(transport.label, entries, _helper_op(transport, "manifest", remote_dir, names))
    # No python3 on the node: GNU find lists every regular file (no content comparison then).
    script = '[ -d "$1" ] || exit 0; find "$1" -type f -printf "%s %T@ %P\\0"'
    result = transport.run(["sh", "-c", script, "sh", remote_dir])
    state: dict[str, tuple] = {}
    for record in result.stdout.split(b"\0"):
        if record:
            size, mtime, name = record.split(b" ", 2)
            state[os.fsdecode(name)] = ("f", int(size), int(float(mtime)))
    return state


def _parse_manifest(label: str, entries: list[LocalEntry], data: bytes) -> dict[str, tuple]:
    records = data.split(b"\0")[: len(entries)]
    if len(records) != len(entries):
        raise SyncError(f"{label}: sync helper returned {len(records)} records for {len(entries)} files")
    state: dict[str, tuple] = {}
    for entry, record in zip(entries, records):
        kind, _, rest = record.partition(b" ")
        if kind == b"f":
            size, mtime = rest.split(b" ")
            state[entry.rel] = ("f", int(size), int(mtime))
        elif kind == b"l":
            state[entry.rel] = ("l", os.fsdecode(rest))
        elif kind in (b"d", b"o"):
            state[entry.rel] = (kind.decode(),)
    return state


def _differing(transport, base: Path, remote_dir: str, candidates: list[LocalEntry]) -> list[LocalEntry]:  # noqa: ANN001
    if not candidates:
        return []
    if not transport.has_command("python3"):
        return candidates
    fields: list[bytes] = []
    for entry in candidates:
        fields += [os.fsencode(entry.rel), str(entry.mtime).encode(), _sha256(base / entry.rel).encode()]
    verdicts = _helper_op(transport, "verify", remote_dir, b"\0".join(fields) + b"\0").split(b"\0")
    return [entry for entry, verdict in zip(candidates, verdicts) if verdict != b"="] + candidates[len(verdicts):]


# A transfer longer than this says how far it got, then again every PROGRESS_EVERY_S: every wait
# longer than a few seconds says what it waits for (60 MB used to be 15 s of silence).
PROGRESS_AFTER_S = 3.0
PROGRESS_EVERY_S = 5.0


class _Progress:
    """A byte stream read on its way to the node, saying how much of `total` went so far."""

    def __init__(self, stream, total: int, files: int, label: str,  # noqa: ANN001 - a binary file
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._stream, self._total, self._files, self._label, self._clock = stream, total, files, label, clock
        self.sent = 0
        self._started = clock()
        self._next = self._started + PROGRESS_AFTER_S

    def read(self, size: int = -1) -> bytes:
        chunk = self._stream.read(size)
        self.sent += len(chunk)
        now = self._clock()
        if chunk and now >= self._next:
            self._next = now + PROGRESS_EVERY_S
            rate = self.sent / max(now - self._started, 1e-6)
            # The tar stream carries headers too: never show more than the files' own bytes.
            shown = min(self.sent, self._total)
            log.warning("syncing %d file(s) to %s: %.1f of %.1f MB sent (%.1f MB/s)", self._files, self._label,
                        shown / 1e6, self._total / 1e6, rate / 1e6)
        return chunk


def _send_tar(transport, base: Path, entries: Iterable[LocalEntry], remote_dir: str) -> None:  # noqa: ANN001
    entries = list(entries)
    tar = _local_tar()
    with tempfile.TemporaryFile() as listing, tempfile.TemporaryFile() as errors:
        listing.write(b"\0".join(os.fsencode(e.rel) for e in entries) + b"\0")
        listing.seek(0)
        # Local tar (C) builds the stream; we only shuttle bytes into the channel. GNU tar would
        # read a listed name starting with '-' as an option without --verbatim-files-from.
        verbatim = ["--verbatim-files-from"] if _is_gnu_tar(tar) else []
        creator = subprocess.Popen(
            [tar, "-C", str(base), "--null", "--no-recursion", *verbatim, "-T", "-", "-cf", "-"],
            stdin=listing, stdout=subprocess.PIPE, stderr=errors, env={**os.environ, "COPYFILE_DISABLE": "1"},
        )
        assert creator.stdout is not None
        extract = 'mkdir -p -- "$1" && exec tar -C "$1" -xf - --no-same-owner'
        try:
            stream = _Progress(creator.stdout, sum(e.size for e in entries), len(entries), transport.label)
            transport.run(["sh", "-c", extract, "sh", remote_dir], input=stream)
        except RemoteCommandError as exc:
            raise SyncError(f"unpacking on {transport.label}:{remote_dir} failed: {exc.message}",
                            hint="running again resumes") from None
        finally:
            creator.stdout.close()
            creator.wait()
        if creator.returncode != 0:
            errors.seek(0)
            message = errors.read()[-2000:].decode(errors="replace").strip()
            raise SyncError(f"local tar failed for {base}: {message or creator.returncode}")


def _local_tar() -> str:
    tar = shutil.which("tar")
    if tar is None:
        raise SyncError("no `tar` on this machine for the tar-delta sync", hint="install tar or rsync")
    return tar


@functools.lru_cache(maxsize=4)
def _is_gnu_tar(tar: str) -> bool:
    version = subprocess.run([tar, "--version"], capture_output=True, check=False).stdout
    return b"GNU tar" in version


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _helper_op(transport, op: str, remote_dir: str, data: bytes) -> bytes:  # noqa: ANN001
    """sync_helper.py's `op` on the node: in the node helper's process when the transport has one."""
    run_op = getattr(transport, "run_helper_op", None)
    if run_op is not None:
        return run_op(op, remote_dir, data, _helper_source())
    return transport.run(["python3", "-c", _helper_source(), op, remote_dir], input=data).stdout


def _helper_source() -> str:
    return (paths.templates_dir() / "sync_helper.py").read_text()
