"""The local provider's node lifecycle, where it meets other processes writing into a node."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from cloudtrain.providers.base import InstanceSpec, InstanceState
from cloudtrain.providers.local import LocalProvider


def _spec(cluster: str) -> InstanceSpec:
    return InstanceSpec(cluster=cluster, instance_type="local", region="local", owner="tester")


def test_terminate_succeeds_while_something_keeps_writing_into_the_node(tmp_path: Path) -> None:
    # A sweep pulling a checkpoint, or a watchdog logging its last tick, writes into the node while
    # `terminate` deletes it: rmtree used to fail with "Directory not empty" and leave the node.
    provider = LocalProvider(tmp_path / "local")
    (node,) = provider.launch(_spec("busy"), 1)
    busy = Path(node.home) / ".cloudtrain" / "busy"
    busy.mkdir(parents=True)
    held = os.open(busy, os.O_RDONLY | os.O_DIRECTORY)
    written, stop = [], threading.Event()

    def keep_writing() -> None:
        # Its last work: a file every millisecond for up to a second, the directory held open.
        until = time.monotonic() + 1.0
        while not stop.is_set() and time.monotonic() < until:
            try:
                fd = os.open(f"f{len(written)}", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=held)
            except FileNotFoundError:
                return  # the directory is gone: nothing more can be added to it
            os.close(fd)
            written.append(1)
            time.sleep(0.001)

    writer = threading.Thread(target=keep_writing)
    writer.start()
    try:
        while len(written) < 50:  # the writer is going
            time.sleep(0.001)
        provider.terminate([node.id])
    finally:
        stop.set()
        writer.join()
        os.close(held)
    assert list((tmp_path / "local").iterdir()) == []
    assert provider.describe([node.id])[0].state == InstanceState.TERMINATED
    assert provider.list_tagged() == []


def test_terminate_twice_and_of_a_node_never_made_is_success(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "local")
    (node,) = provider.launch(_spec("twice"), 1)
    provider.terminate([node.id])
    provider.terminate([node.id, "local-never-0"])
    assert provider.describe([node.id])[0].state == InstanceState.TERMINATED


def test_a_node_being_deleted_is_not_listed(tmp_path: Path) -> None:
    provider = LocalProvider(tmp_path / "local")
    (node,) = provider.launch(_spec("going"), 1)
    # What terminate leaves for a moment between its rename and the end of the delete.
    Path(node.home).rename(Path(node.home).with_name(".deleting-" + Path(node.home).name + "-1-2"))
    assert provider.list_tagged() == []
