"""autostop and budget are accepted exactly where the machine can stop (or delete) itself."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import cloudtrain

BASE = 'name: demo\nresources: {cloud: CLOUD, accelerators: "T4:1"}\nrun: x\n'
SSH_BASE = 'name: demo\nresources: {cloud: ssh, hosts: [{address: 10.0.0.5, user: me}]}\nrun: x\n'


@pytest.mark.parametrize(("cloud", "extra", "ok", "fragment"), [
    ("aws", "autostop: {idle_minutes: 10, down: true}\n", True, "plan:"),
    ("gcp", "autostop: {idle_minutes: 10}\nbudget: {max_hours: 2}\n", True, "at most $1.60 for 2 h (failover may reach $0.798/h)"),
    # A GCP VM deletes itself with its service account's token from the metadata server.
    ("gcp", "autostop: {idle_minutes: 10, down: true}\n", True, "plan: n1-standard-4+t4x1 (T4:1) in gcp/us-central1"),
    # Azure VMs deallocate (or delete) themselves through ARM with their managed identity.
    ("azure", "autostop: {idle_minutes: 10, down: true}\nbudget: {max_hours: 2}\n", True, "at most $2.41 for 2 h (failover may reach $1.204/h)"),
    # Hosts of the `ssh` cloud are the user's own machines: cloudtrain never stops them.
    ("ssh", "autostop: {idle_minutes: 10}\n", False, "autostop"),
])
def test_autostop_where_the_cloud_can_honour_it(tmp_path: Path, cloud: str, extra: str, ok: bool, fragment: str) -> None:
    (tmp_path / "r.yaml").write_text((SSH_BASE if cloud == "ssh" else BASE.replace("CLOUD", cloud)) + extra)
    proc = cloudtrain("validate", "r.yaml", cwd=tmp_path)
    assert (proc.returncode == 0) is ok, proc.stdout + proc.stderr
    assert fragment in (proc.stdout if ok else proc.stderr)
    if not ok:
        assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1
