"""Workdir sync over real SSH (rsync and tar-delta), deltas, interruptions, and log follow over a flaky link."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from cloudtrain.errors import RemoteError
from cloudtrain.providers.base import Instance, InstanceState
from cloudtrain.remote import jobs
from cloudtrain.remote.ignore import load_ignore
from cloudtrain.remote.ssh import ConnectionLostError, SSHTransport, open_transport
from cloudtrain.remote.sync import sync_tree
from cloudtrain.testing.sshd import SshdFactory, SshdVM
from cloudtrain.testing.tcpproxy import TcpProxy
from cloudtrain.testing.wait import wait_until
from tests.remote.conftest import fast_config

METHODS = ["rsync", "tar-delta"]


def _workdir(root: Path) -> Path:
    files = {
        "train.py": "print('train')\n",
        "pkg/__init__.py": "",
        "pkg/model.py": "W = 1\n",
        "data/labels.csv": "a,b\n1,2\n",
        "odd names/it's \"quoted\" $(x);.txt": "odd\n",
        "-leading-dash.txt": "dash\n",
        "ignored.log": "noise\n",
        ".git/HEAD": "ref\n",
        "runs/old/metrics.json": "{}\n",
    }
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "pkg" / "weights.bin").write_bytes(os.urandom(300_000))
    (root / ".gitignore").write_text("*.log\n")
    os.symlink("pkg/model.py", root / "model_link.py")
    return root


def _remote_digests(t: SSHTransport, remote_dir: str) -> dict[str, str]:
    # An interrupted rsync's receiver may still be removing its temp file: tolerate vanishing files.
    script = 'cd "$1" && find . \\( -type f -o -type l \\) -print0 | sort -z | xargs -0 -r sha256sum -- 2>/dev/null; exit 0'
    out = t.run(["sh", "-c", script, "sh", remote_dir]).text
    digests = {}
    for line in out.splitlines():
        digest, name = line.split("  ", 1)
        digests[name[2:]] = digest
    return digests


def _local_digests(root: Path, ignore=None) -> dict[str, str]:  # noqa: ANN001
    from cloudtrain.remote.sync import scan_tree

    scan = scan_tree(root, ignore)
    return {e.rel: hashlib.sha256((scan.base / e.rel).read_bytes()).hexdigest() for e in scan.entries}


@pytest.mark.parametrize("method", METHODS)
def test_sync_sends_only_changes(method: str, transport: SSHTransport, tmp_path: Path) -> None:
    src = _workdir(tmp_path / "src")
    remote = f"{transport.home}/.cloudtrain/c/workdir"
    ignore = load_ignore(src)

    first = sync_tree(transport, src, remote, ignore, method=method)
    assert first.method == method
    assert first.files_total == first.files_sent == 9  # .gitignore + 7 files + the symlink
    assert _remote_digests(transport, remote) == _local_digests(src, ignore)
    assert transport.run(["readlink", f"{remote}/model_link.py"]).text == "pkg/model.py\n"
    assert transport.run(["test", "!", "-e", f"{remote}/ignored.log"], check=False).exit_code == 0

    again = sync_tree(transport, src, remote, ignore, method=method)
    assert (again.files_total, again.files_sent, again.bytes_sent) == (9, 0, 0)

    (src / "pkg" / "model.py").write_text("W = 2  # changed\n")
    one = sync_tree(transport, src, remote, ignore, method=method)
    assert (one.files_sent, one.bytes_sent) == (1, len("W = 2  # changed\n"))
    assert transport.run(["cat", f"{remote}/pkg/model.py"]).text == "W = 2  # changed\n"


# (VERIFY_BYTES, files sent when only the mtime changed): up to VERIFY_BYTES of such files are sent
# (cheaper than the round trip comparing them), more are compared by content first.
@pytest.mark.parametrize(("verify_bytes", "sent_if_same"), [(0, 0), (256 << 10, 1)])
def test_tar_delta_compares_content_when_only_mtime_changed(transport: SSHTransport, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch, verify_bytes: int,
                                                            sent_if_same: int) -> None:
    from cloudtrain.remote import sync

    monkeypatch.setattr(sync, "VERIFY_BYTES", verify_bytes)
    src = _workdir(tmp_path / "src")
    remote = f"{transport.home}/w"
    sync_tree(transport, src, remote, method="tar-delta")
    future = time.time() + 100
    os.utime(src / "train.py", (future, future))  # e.g. a fresh git checkout: same bytes
    assert sync_tree(transport, src, remote, method="tar-delta").files_sent == sent_if_same
    # ... and the node's mtime was aligned, so the next check is the cheap one again.
    assert transport.run(["stat", "-c", "%Y", f"{remote}/train.py"]).text.strip() == str(int(future))
    (src / "train.py").write_text("print('TRAIN')\n")  # same size, new content
    os.utime(src / "train.py", (future + 5, future + 5))
    assert sync_tree(transport, src, remote, method="tar-delta").files_sent == 1


def test_tar_delta_without_python_on_the_node(transport: SSHTransport, tmp_path: Path) -> None:
    src = _workdir(tmp_path / "src")
    remote = f"{transport.home}/w"
    # A minimal image: pretend the node has no python3, so `find -printf` lists the files.
    transport._commands["python3"] = False
    ignore = load_ignore(src)
    assert sync_tree(transport, src, remote, ignore, method="tar-delta").files_sent == 9
    # Without python3 there is no link reading or hashing on the node: only the symlink is resent.
    assert sync_tree(transport, src, remote, ignore, method="tar-delta").files_sent == 1
    assert _remote_digests(transport, remote) == _local_digests(src, ignore)


def test_auto_sends_small_files_by_tar_and_a_single_file_lands_inside(transport: SSHTransport, tmp_path: Path) -> None:
    data = tmp_path / "dataset.npz"
    data.write_bytes(os.urandom(1000))
    target = f"{transport.home}/w/my data's $(dir)/deep"
    stats = transport.put_tree(data, target)
    assert (stats.method, stats.files_sent) == ("tar-delta", 1)
    assert transport.run(["wc", "-c", f"{target}/dataset.npz"]).text.split()[0] == "1000"


def test_auto_uses_rsync_for_an_edited_large_file(transport: SSHTransport, tmp_path: Path) -> None:
    from cloudtrain.remote.sync import RSYNC_DELTA_BYTES

    src = tmp_path / "src"
    src.mkdir()
    big = bytearray(os.urandom(RSYNC_DELTA_BYTES + 4096))
    (src / "weights.bin").write_bytes(big)
    (src / "train.py").write_text("print(1)\n")
    first = transport.put_tree(src, f"{transport.home}/w")
    assert (first.method, first.files_sent) == ("tar-delta", 2)  # new files: one tar stream
    big[100:110] = b"0123456789"
    (src / "weights.bin").write_bytes(big)
    os.utime(src / "weights.bin", (1, 1))
    second = transport.put_tree(src, f"{transport.home}/w")
    assert (second.method, second.files_sent) == ("rsync", 1)  # an edit inside a big file: the delta
    assert _remote_digests(transport, f"{transport.home}/w") == _local_digests(src, None)


def test_large_tree_warns(transport: SSHTransport, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "big.bin").write_bytes(os.urandom(50_000))
    with caplog.at_level(logging.WARNING, logger="cloudtrain.remote.sync"):
        stats = sync_tree(transport, src, f"{transport.home}/w", warn_bytes=10_000)
    assert stats.large and stats.bytes_total == 50_000
    assert ".cloudtrainignore" in caplog.text


@pytest.fixture
def flaky(sshd_vm: SshdVM, sshd_vm_factory: SshdFactory, tcp_proxy) -> Iterator[tuple[SSHTransport, TcpProxy]]:  # noqa: ANN001
    """A transport whose TCP connections run through a proxy that can cut them."""
    proxy: TcpProxy = tcp_proxy(sshd_vm.port)
    instance = Instance(id="i-flaky", cluster="c", state=InstanceState.RUNNING, public_ip="127.0.0.1",
                        ssh_port=proxy.port, ssh_user=sshd_vm.user)
    t = open_transport(cluster="c", instance=instance, config=fast_config(connect_retries_s=10),
                       key_path=sshd_vm_factory.client_key.private_path)
    yield t, proxy
    t.close()


@pytest.mark.parametrize("method", METHODS)
def test_sync_cut_midway_completes_on_retry(method: str, flaky: tuple[SSHTransport, TcpProxy], tmp_path: Path) -> None:
    t, proxy = flaky
    src = tmp_path / "src"
    for i in range(24):
        (src / f"part{i // 8}").mkdir(parents=True, exist_ok=True)
        (src / f"part{i // 8}" / f"shard{i}.bin").write_bytes(os.urandom(400_000))
    remote = f"{t.home}/w"
    proxy.cut_after(3_000_000)
    with pytest.raises(RemoteError):
        sync_tree(t, src, remote, method=method)
    assert proxy.cuts == 1
    partial = _remote_digests(t, remote)
    assert partial != _local_digests(src)  # really interrupted

    retry = sync_tree(t, src, remote, method=method)
    assert 0 < retry.files_sent < 24 or method == "rsync"
    assert _remote_digests(t, remote) == _local_digests(src)


def test_log_follow_survives_dropped_connections(flaky: tuple[SSHTransport, TcpProxy]) -> None:
    t, proxy = flaky
    layout = jobs.NodeLayout.for_cluster(t, "c")
    jobs.install_runtime(t, layout)
    t.run(["mkdir", "-p", layout.workdir])
    lines = 80
    jobs.submit(t, layout, "j1", f'i=0; while [ $i -lt {lines} ]; do echo "line $i"; i=$((i+1)); sleep 0.03; done', {})

    offset, collected, lost, cuts_done = 0, b"", 0, 0
    timer: threading.Timer | None = None
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            chunk = jobs.read_log(t, layout, "j1", offset)
            if not chunk:
                if jobs.status(t, layout, "j1").finished and not jobs.read_log(t, layout, "j1", offset):
                    break
                time.sleep(0.05)
                continue
        except ConnectionLostError:
            lost += 1  # the command's fate is unknown; read_log is idempotent, so ask again
            continue
        collected += chunk
        offset += len(chunk)
        if cuts_done == 0 and offset > 100:
            proxy.cut_all()  # between two calls: the next call reconnects by itself
            cuts_done = 1
            # "Between two calls" means the drop was seen before the next one; a call sent in the
            # moment before the reader notices is a cut mid-call (the third cut covers that).
            wait_until(lambda: not t.connected, timeout=30, what="the client to notice the cut")
            assert jobs.status(t, layout, "j1").state == "running"  # the job did not notice
        elif cuts_done == 1 and offset > 400:
            timer = threading.Timer(0.01, proxy.cut_all)  # lands whenever it lands, maybe mid-call
            timer.start()
            cuts_done = 2
    if timer:
        timer.join()
    assert collected.decode().splitlines() == [f"line {i}" for i in range(lines)]
    assert jobs.status(t, layout, "j1").state == "succeeded"
    assert t.connects >= 2 and proxy.cuts >= 2


@pytest.mark.parametrize("method", METHODS)
def test_ignored_names_that_look_like_wildcards_stay_exact(method: str, transport: SSHTransport, tmp_path: Path) -> None:
    src = tmp_path / "src"
    src.mkdir()
    for name in ["data[1].csv", "data1.csv", "star*.txt", "starX.txt", "keep.txt"]:
        (src / name).write_text(name)
    # Ignore the literal names; read as globs they would also match data1.csv and starX.txt.
    (src / ".cloudtrainignore").write_text("data\\[1\\].csv\nstar\\*.txt\n")
    ignore = load_ignore(src)
    sync_tree(transport, src, f"{transport.home}/w", ignore, method=method)
    assert sorted(_remote_digests(transport, f"{transport.home}/w")) == [
        ".cloudtrainignore", "data1.csv", "keep.txt", "starX.txt"]


def test_a_new_directory_is_filled_without_listing_it_first(transport: SSHTransport, tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg").mkdir(parents=True)
    for i in range(20):
        (src / "pkg" / f"m{i}.py").write_text(f"V = {i}\n")
    dest = f"{transport.home}/fresh"
    transport.run(["mkdir", "-p", dest])  # as the node's preparation did, in the same command
    before = list(transport.round_trips.turns)
    stats = sync_tree(transport, src, dest, new_dir=True)
    turns = transport.round_trips.turns[len(before):]
    assert stats.files_sent == 20 and stats.method == "tar-delta"
    assert not any(t.startswith("manifest") for t in turns), turns  # nothing asked: one round trip, the tar
    assert len(turns) == 1, turns
    assert transport.run(["cat", f"{dest}/pkg/m7.py"]).text == "V = 7\n"
