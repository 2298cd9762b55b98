"""A node preempted while its results are collected, on the Azure fake (docs/recovery.md).

The AWS and GCP legs of this scenario are in tests/e2e/test_recovery_e2e.py; Azure's differs in
how the machine goes (the fake ARM evicts the spot VM per its evictionPolicy: deallocated or
deleted) and in where the next attempt goes (a regional VM has no zone: the whole region is ruled
out, so the relaunch is in another region).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import recovery as rk
from cloudtrain.testing import sshd
from cloudtrain.testing.faults import NodeCommandGate
from cloudtrain.testing.wait import wait_until

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


# Delete only: a VM evicted under Deallocate (the policy of a run without autostop `down`, as
# here) is proven in a run by test_recovery_e2e.py::test_a_preempted_run_job_resumes_in_another_zone_with_the_same_results[azure]
# (the loss seen, the relaunch in another region) and described stopped and spot by
# tests/providers/test_contract.py::test_a_reclaimed_spot_machine_is_described_going_and_spot[azure];
# when in the attempt the loss comes (collect) is cloud-agnostic, proven on AWS by
# test_recovery_e2e.py::test_a_node_preempted_while_its_results_are_collected_is_relaunched_and_collected_again.
# A deleted VM is gone from ARM whole: this is the e2e where a run sees that as a loss.
@pytest.mark.parametrize("eviction", ["Delete"])
def test_an_azure_vm_evicted_while_its_results_are_collected_is_relaunched_elsewhere_and_collected_again(
        azure_cloud: Any, eviction: str, tmp_path: Path) -> None:
    """The job succeeded; while collect copies its results (the node's `tar` of them parked at a
    gate of the test kit) the fake ARM evicts the spot VM. The next attempt, in another region,
    resumes from the job's last checkpoint (it only writes its results again) and collect runs
    again; the run ends with the files of an uninterrupted run and the fake's bill."""
    cloud = azure_cloud
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "go").touch()  # the job runs through: the loss comes after it
    proc = rk.start(cloud, rk.recipe(cloud, marks))
    gate = None
    try:
        first_region, machine, vm = wait_until(lambda: rk.running(cloud), 300, "the first machine")
        (raw,) = cloud.server.find("Microsoft.Compute/virtualMachines", machine)
        with cloud.server.lock:  # the policy the VM was created with decides what eviction does
            raw["properties"]["evictionPolicy"] = eviction
        # Collect's copy of the results: `tar --no-recursion ... -cf -` (the checkpoint puller's has neither).
        gate = NodeCommandGate.install(vm.bin_dir, "tar", ["--no-recursion", "-cf"], tmp_path / "gate")
        wait_until(lambda: gate.held, 300, "collect copying the results")
        rk.kept(cloud, at_least=rk.STEPS)  # the job's last checkpoint is home (its puller has its own connection)
        rk.preempt(cloud, first_region, machine)
        out, err = rk.finish(proc, marks)
    finally:
        rk.stop(proc, gate)
    run_dir, record = rk.ended(proc, out, err)
    one, two = record["attempts"]
    assert (one["outcome"], two["outcome"]) == ("preempted", "succeeded"), record["attempts"]
    assert "while collecting the results" in one["reason"], one
    assert json.loads((run_dir / "attempts.json").read_text())[0]["reason"] == one["reason"]
    assert one["region"] == first_region and two["region"] != first_region, record["attempts"]
    assert (marks / "starts").read_text().split("\n")[:2] == ["start 0 -", f"start {rk.STEPS} -"]
    assert two["resumed_from_epoch"] == rk.STEPS
    assert json.loads((run_dir / "outputs" / "result.json").read_text()) == {"steps": rk.STEPS, "total": rk.TOTAL}
    assert record["status"] == "succeeded" and record["collect_error"] is None
    assert "outputs/result.json" in record["results"]
    billed = cloud.bill.usd(cloud.cluster, until=record["ended_at"])
    hourly = max(a["hourly_price_usd"] for a in record["attempts"])
    assert record["cost_usd"] == pytest.approx(billed, rel=0.01, abs=4 * hourly / 3600), cloud.bill.instances(cloud.cluster)
    assert len(cloud.bill.instances(cloud.cluster)) == 2
    assert cloud.leftovers() == []
