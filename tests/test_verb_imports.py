"""Verbs that only talk to the node load no cloud SDK, and the SSH rule is still the caller's.

`exec`, `logs` and `cancel` on a running GCP or Azure cluster are run the way a user runs them
(the CLI as a subprocess, against the kit's fakes and sshd VMs) under `python -X importtime`,
which names every module the process imported: no google-cloud-compute, google-auth, Azure SDK
or boto3 among them (issue 36, item 4). They may skip the cloud because the SSH rule's answer is
remembered (cluster/ingress.py); what that must not cost is shown on GCP: a rule moved behind our
back (another machine, the console) is put back after the connect it broke, and a remembered
answer older than TRUST_S is asked again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import sshd

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

# What a node-only verb must not import: the providers' SDKs and what they stand on.
SDK_PREFIXES = ("google.cloud.compute_v1", "google.api_core", "google.auth", "azure.core", "azure.identity",
                "azure.mgmt.compute", "azure.mgmt.network", "azure.mgmt.resource", "boto3", "botocore")
SDK_OF = {"gcp": "google.cloud.compute_v1", "azure": "azure.mgmt.network"}
AUTH_OF = {"gcp": "google.auth", "azure": "azure.identity"}


def _installed(module: str) -> bool:
    from importlib.util import find_spec

    try:
        return find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def imports_of(cloud: Any, *args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    """`cloudtrain ARGS...` in the cloud's environment under -X importtime: its result and the
    modules it imported."""
    env = {**os.environ, **cloud.env}
    proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "cloudtrain", *args], cwd=str(cloud.root),
                          env=env, capture_output=True, text=True, timeout=300, check=False)
    timings = [line for line in proc.stderr.splitlines() if line.startswith("import time:")]
    modules = {line.rsplit("|", 1)[1].strip() for line in timings[1:]}  # the first line names the columns
    proc.stderr = "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))
    return proc, modules


def sdk_modules(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.startswith(SDK_PREFIXES))


def workdir(root: Path) -> Path:
    path = root / "project"
    (path / "src").mkdir(parents=True, exist_ok=True)
    (path / "train.py").write_text("print('train')\n")
    (path / "src" / "util.py").write_text("VALUE = 1\n")
    return path


@pytest.mark.parametrize("cloud_name", ["gcp", "azure"])
def test_exec_logs_and_cancel_on_a_running_cluster_load_no_cloud_sdk(fake_cloud: Any, cloud_name: str) -> None:
    if not _installed(SDK_OF[cloud_name]):
        pytest.skip(f"{SDK_OF[cloud_name]} is not installed")
    cloud = fake_cloud(cloud_name)
    recipe = cloud.recipe(run="true", workdir=str(workdir(cloud.root)))
    up = cloud.up(recipe)
    assert up.ok, up.output

    ran, modules = imports_of(cloud, "exec", cloud.cluster, "--", "echo", "reached")
    assert ran.returncode == 0 and "reached" in ran.stdout, ran.stderr[-3000:]
    assert "cloudtrain.cluster.ingress" in modules  # the rule's check was on the way
    assert sdk_modules(modules) == []

    started = cloud.cli("exec", cloud.cluster, "--detach", "--", "sh", "-c", "echo begun; sleep 120")
    assert started.ok, started.output
    logs, modules = imports_of(cloud, "logs", cloud.cluster)
    assert logs.returncode == 0 and "begun" in logs.stdout, logs.stderr[-3000:]
    assert sdk_modules(modules) == []

    cancel, modules = imports_of(cloud, "cancel", cloud.cluster)
    assert cancel.returncode == 0 and "killed" in cancel.stdout, cancel.stdout + cancel.stderr[-3000:]
    assert sdk_modules(modules) == []

    # A verb that asks the cloud still does: over the cloud's REST API with its auth library only
    # (issue 36.4: the management SDKs cost seconds of import; writes keep them).
    status, modules = imports_of(cloud, "status", cloud.cluster, "--refresh")
    assert status.returncode == 0, status.stderr[-3000:]
    assert AUTH_OF[cloud_name] in modules and "boto3" not in modules
    assert not [m for m in modules if m.startswith(("google.cloud.compute_v1", "azure.mgmt."))], sorted(modules)
    assert cloud.down().ok


def test_a_rule_moved_behind_our_back_is_put_back_after_the_connect_it_broke(fake_cloud: Any) -> None:
    if not _installed("google.cloud.compute_v1"):
        pytest.skip("google-cloud-compute is not installed")
    from cloudtrain.cluster.ingress import TRUST_S

    cloud = fake_cloud("gcp")
    # Every command connects itself (no connection left from the previous one to reuse): what the
    # rule admits is what decides.
    cloud.env["CLOUDTRAIN_SSH_PERSIST_S"] = "0"
    up = cloud.up(cloud.recipe(run="true"))
    assert up.ok, up.output
    (rule,) = [r for r in cloud.firewall_rules() if r["name"].endswith("-ssh")]
    asked = len(cloud.faults.seen("firewalls.get"))
    assert cloud.cli("exec", cloud.cluster, "--", "true").ok
    assert len(cloud.faults.seen("firewalls.get")) == asked  # remembered from `up`: the cloud not asked

    # Someone else's cloudtrain, from another address, moved the rule to theirs.
    from google.cloud import compute_v1

    firewalls = cloud.server.client("firewalls")
    firewalls.patch_unary(project=cloud.server.project, firewall=rule["name"],
                          firewall_resource=compute_v1.Firewall(source_ranges=["198.51.100.77/32"]))
    (rule,) = [r for r in cloud.firewall_rules() if r["name"].endswith("-ssh")]
    assert rule["sourceRanges"] == ["198.51.100.77/32"]
    cloud.configure(ssh={"connect_retries_s": 1})  # the failed connect: seconds, not the boot window
    back = cloud.cli("exec", cloud.cluster, "--", "echo", "reached")
    assert back.ok and "reached" in back.stdout, back.output
    assert "admitted 198.51.100.77/32, not you" in back.stderr
    (rule,) = [r for r in cloud.firewall_rules() if r["name"].endswith("-ssh")]
    assert rule["sourceRanges"] == [cloud.allowed_cidr]

    # A remembered answer is believed for TRUST_S only.
    path = cloud.home / "ingress" / f"{cloud.cluster}.json"
    saved = json.loads(path.read_text())
    assert saved["cidr"] == cloud.allowed_cidr
    asked = len(cloud.faults.seen("firewalls.get"))
    path.write_text(json.dumps({**saved, "checked_at": time.time() - TRUST_S - 1}))
    assert cloud.cli("exec", cloud.cluster, "--", "true").ok
    assert len(cloud.faults.seen("firewalls.get")) == asked + 1
    assert cloud.cli("exec", cloud.cluster, "--", "true").ok
    assert len(cloud.faults.seen("firewalls.get")) == asked + 1

    down = cloud.down()
    assert down.ok, down.output
    assert not path.exists()  # `down` forgets it with the cluster's key


def test_stop_start_gc_and_down_on_gcp_load_no_compute_sdk(fake_cloud: Any) -> None:
    """The verbs that change machines but make none (and `gc`, which lists them) talk to Compute Engine over its REST API with
    google-auth only (issue 36.4): no google.cloud.compute_v1 (2-4 s of import), and they still
    do what they say: stopped, started, and nothing left after `down`."""
    if not _installed("google.cloud.compute_v1"):
        pytest.skip("google-cloud-compute is not installed")
    cloud = fake_cloud("gcp")
    up = cloud.up(cloud.recipe(run="true"))
    assert up.ok, up.output
    ((zone, inst),) = cloud.instances()

    def sdk_of(*args: str) -> list[str]:
        ran, modules = imports_of(cloud, *args)
        assert ran.returncode == 0, ran.stdout + ran.stderr[-3000:]
        assert "google.auth" in modules  # it did ask the cloud
        return [m for m in modules if m.startswith("google.cloud.compute_v1")]

    assert sdk_of("stop", cloud.cluster) == []
    assert (cloud.server.instance(zone, inst["name"]) or {}).get("status") == "TERMINATED"
    assert sdk_of("start", cloud.cluster) == []
    assert (cloud.server.instance(zone, inst["name"]) or {}).get("status") == "RUNNING"
    # `gc` lists the tagged machines and checks the credentials over REST too: a live cluster of
    # this state is no leak, and nothing is removed.
    gc, modules = imports_of(cloud, "gc", "--cloud", "gcp")
    assert gc.returncode == 0, gc.stdout + gc.stderr[-3000:]
    assert "google.auth" in modules and [m for m in modules if m.startswith("google.cloud.compute_v1")] == []
    assert (cloud.server.instance(zone, inst["name"]) or {}).get("status") == "RUNNING"
    assert sdk_of("down", cloud.cluster) == []
    assert cloud.leftovers() == []
