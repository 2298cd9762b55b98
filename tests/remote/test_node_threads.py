"""Work on several nodes at once (cluster/nodes.py on_all, connect): errors name a node, never a
Python repr, and an import another node's thread is making cannot break this one's error handling."""

from __future__ import annotations

import importlib.machinery
import sys
import types

import pytest

from cloudtrain.cluster.nodes import on_all
from cloudtrain.errors import RemoteError
from cloudtrain.remote.channel import ConnectionLostError, transfer_errors
from cloudtrain.state import NodeRecord

pytestmark = pytest.mark.quick


def _record(rank: int) -> NodeRecord:
    return NodeRecord(cluster="c", rank=rank, instance_id=f"vm-{rank}", state="running", public_ip="10.0.0.1",
                      private_ip=None, ssh_user="u", ssh_port=22, ssh_key=None, proxy_command=None, started_at=None)


def test_a_failure_on_one_node_names_it_without_a_repr() -> None:
    def fail(record: NodeRecord) -> None:
        if record.rank == 1:
            raise ConnectionLostError("u@10.0.0.1: connection lost while preparing the node: [Errno 32] Broken pipe")

    with pytest.raises(RemoteError) as failed:
        on_all([_record(0), _record(1)], fail)
    message = failed.value.message
    assert message.startswith("node 1 (vm-1): u@10.0.0.1: connection lost"), message
    assert "NodeRecord(" not in message and "Node(" not in message


def test_transfer_errors_while_another_thread_imports_paramiko(monkeypatch: pytest.MonkeyPatch) -> None:
    # What another node's thread leaves in sys.modules while it imports paramiko (it connects itself).
    partial = types.ModuleType("paramiko")
    partial.__spec__ = importlib.machinery.ModuleSpec("paramiko", None)
    partial.__spec__._initializing = True  # noqa: SLF001 - how the import system marks it
    monkeypatch.setitem(sys.modules, "paramiko", partial)
    with pytest.raises(AttributeError):
        partial.SSHException  # noqa: B018 - "partially initialized module 'paramiko' has no attribute"
    assert transfer_errors() == (EOFError, OSError)
