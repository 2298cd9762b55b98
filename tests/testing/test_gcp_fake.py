"""The fake Compute Engine behaves like Compute Engine where cloudtrain relies on it, read through
the real SDK (google-cloud-compute over REST) with google-auth's real service-account path.

Authentication, operations and `wait`, validation, filters, faults (HTTP and DONE-with-error),
the instance lifecycle, firewalls, maxRunDuration and spot, and the machines behind instances.
The provider's own behaviour is tested in tests/providers/test_gcp.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing.gcp import PROJECT, GceServer

from tests.lazy import Lazy, requires

pytestmark = [pytest.mark.quick, requires("google.cloud.compute_v1")]
compute_v1 = Lazy("google.cloud.compute_v1")
api_exceptions = Lazy("google.api_core.exceptions")

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTheFakeGceServerOnly test"
ZONE = "us-central1-a"
DLVM = "projects/deeplearning-platform-release/global/images/family/common-cu128-ubuntu-2204-nvidia-570"


class Gce:
    """SDK clients of one fake, and helpers to make instances the way the API wants them."""

    def __init__(self, server: GceServer) -> None:
        self.server = server
        self.instances = server.client("instances")
        self.ops = server.client("zone_operations")
        self.firewalls = server.client("firewalls")
        self.global_ops = server.client("global_operations")

    def body(self, name: str = "vm", machine: str = "e2-standard-2", zone: str = ZONE, **extra: Any) -> dict:
        body = {
            "name": name, "machine_type": f"zones/{zone}/machineTypes/{machine}",
            "disks": [{"boot": True, "auto_delete": True, "initialize_params": {
                "source_image": "projects/ubuntu-os-cloud/global/images/family/ubuntu-2204-lts"}}],
            "network_interfaces": [{"network": "global/networks/default",
                                    "access_configs": [{"name": "External NAT", "type_": "ONE_TO_ONE_NAT"}]}],
            "labels": {"cloudtrain-cluster": "c1"},
            "metadata": {"items": [{"key": "ssh-keys", "value": f"me:{KEY}"}]},
        }
        body.update(extra)
        return body

    def insert(self, zone: str = ZONE, **body: Any) -> Any:
        return self.instances.insert_unary(project=PROJECT, zone=zone, instance_resource=compute_v1.Instance(
            self.body(zone=zone, **body)))

    def wait(self, op: Any, zone: str = ZONE) -> Any:
        return self.ops.wait(project=PROJECT, zone=zone, operation=op.name)

    def create(self, zone: str = ZONE, **body: Any) -> Any:
        done = self.wait(self.insert(zone, **body), zone)
        assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors, done
        return self.instances.get(project=PROJECT, zone=zone, instance=body.get("name", "vm"))

    def names(self, expression: str) -> list[str]:
        pages = self.instances.aggregated_list(request={"project": PROJECT, "filter": expression})
        return sorted(i.name for _, scoped in pages for i in scoped.instances)


@pytest.fixture
def gce(gce_server: GceServer) -> Gce:
    return Gce(gce_server)


def test_google_auth_signs_and_the_fake_checks_the_signature(gce: Gce, gce_server: GceServer,
                                                             tmp_path: Path) -> None:
    zones = list(gce.server.client("zones").list(project=PROJECT))
    assert "us-central1-a" in [z.name for z in zones] and all(z.status == "UP" for z in zones)
    assert gce_server.faults.seen("zones.list")  # the request carried a JWT the fake verified
    stranger = gce_server.add_service_account(tmp_path / "stranger.json", known=False)
    from google.oauth2 import service_account

    credentials = service_account.Credentials.from_service_account_file(
        str(stranger), scopes=["https://www.googleapis.com/auth/cloud-platform"])
    client = compute_v1.ZonesClient(credentials=credentials, transport="rest",
                                    client_options={"api_endpoint": gce_server.url})
    with pytest.raises(api_exceptions.Unauthorized) as caught:
        list(client.list(project=PROJECT))
    assert caught.value.errors[0]["reason"] == "authError"
    import requests

    bare = requests.get(f"{gce_server.url}/compute/v1/projects/{PROJECT}/zones", timeout=10)
    assert bare.status_code == 401
    with pytest.raises(api_exceptions.NotFound):
        gce.server.client("zones").get(project="someone-elses", zone=ZONE)


def test_insert_is_an_operation_and_wait_returns_it_done(gce: Gce) -> None:
    op = gce.insert()
    assert op.status != compute_v1.Operation.Status.DONE and op.operation_type == "insert" and op.target_link.endswith("/instances/vm")
    inst = gce.instances.get(project=PROJECT, zone=ZONE, instance="vm")
    assert inst.status in ("PROVISIONING", "RUNNING")  # exists from the moment the insert is accepted
    done = gce.wait(op)
    assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors
    inst = gce.instances.get(project=PROJECT, zone=ZONE, instance="vm")
    assert inst.status == "RUNNING" and inst.network_interfaces[0].access_configs[0].nat_i_p.startswith("34.")
    assert inst.self_link.endswith(f"/projects/{PROJECT}/zones/{ZONE}/instances/vm")
    assert inst.scheduling.on_host_maintenance == "MIGRATE" and inst.scheduling.automatic_restart
    (disk,) = gce.server.client("disks").list(project=PROJECT, zone=ZONE)
    assert disk.name == "vm" and disk.size_gb == 10  # the image's size when none is asked
    with pytest.raises(api_exceptions.Conflict):
        gce.insert()


def test_a_request_id_makes_an_insert_idempotent(gce: Gce) -> None:
    request = {"project": PROJECT, "zone": ZONE, "instance_resource": compute_v1.Instance(gce.body()),
               "request_id": "8c0d3a0e-0000-4000-8000-000000000001"}
    first = gce.instances.insert_unary(request=request)
    again = gce.instances.insert_unary(request=request)
    assert first.name == again.name
    assert gce.names("") == ["vm"]


@pytest.mark.parametrize("change,field,reason", [
    ({"machine_type": None}, "resource.machineType", "required"),
    ({"machine_type": "zones/us-central1-a/machineTypes/n9-huge-4"}, "resource.machineType", "invalid"),
    ({"name": "x" * 64}, "resource.name", "invalid"),
    ({"name": "Upper"}, "resource.name", "invalid"),
    ({"labels": {"cloudtrain-cluster": "Has Spaces"}}, "resource.labels", "invalid"),
    ({"labels": {"Team": "ml"}}, "resource.labels", "invalid"),
    ({"labels": {"k": "v" * 64}}, "resource.labels", "invalid"),
    ({"machine_type": "zones/us-central1-a/machineTypes/n1-standard-4",
      "guest_accelerators": [{"accelerator_type": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
                              "accelerator_count": 1}]}, "resource.scheduling.onHostMaintenance", "invalid"),
    ({"machine_type": "zones/us-central1-a/machineTypes/g2-standard-4"}, "resource.scheduling.onHostMaintenance",
     "invalid"),
    ({"guest_accelerators": [{"accelerator_type": "zones/us-central1-a/acceleratorTypes/nvidia-tesla-t4",
                              "accelerator_count": 1}], "scheduling": {"on_host_maintenance": "TERMINATE"}},
     "resource.guestAccelerators[0].acceleratorType", "invalid"),
    ({"machine_type": "zones/us-east1-b/machineTypes/n1-standard-4",
      "guest_accelerators": [{"accelerator_type": "zones/us-east1-b/acceleratorTypes/nvidia-tesla-t4",
                              "accelerator_count": 1}], "scheduling": {"on_host_maintenance": "TERMINATE"}},
     "resource.machineType", "invalid"),
    ({"scheduling": {"provisioning_model": "SPOT", "automatic_restart": True}},
     "resource.scheduling.automaticRestart", "invalid"),
    ({"scheduling": {"provisioning_model": "SPOT", "automatic_restart": False, "on_host_maintenance": "MIGRATE"}},
     "resource.scheduling.onHostMaintenance", "invalid"),
    ({"scheduling": {"max_run_duration": {"seconds": 3600}}}, "resource.scheduling.instanceTerminationAction",
     "invalid"),
    ({"scheduling": {"max_run_duration": {"seconds": 10}, "instance_termination_action": "STOP"}},
     "resource.scheduling.maxRunDuration.seconds", "invalid"),
    ({"disks": [{"boot": True, "initialize_params": {
        "source_image": DLVM, "disk_size_gb": 20}}]}, "resource.disks[0].initializeParams.diskSizeGb", "invalid"),
])
def test_instance_bodies_are_validated_like_the_api(gce: Gce, change: dict, field: str, reason: str) -> None:
    body = gce.body()
    for key, value in change.items():
        if value is None:
            body.pop(key)
        else:
            body[key] = value
    with pytest.raises(api_exceptions.BadRequest) as caught:
        gce.instances.insert_unary(project=PROJECT, zone=ZONE, instance_resource=compute_v1.Instance(body))
    assert caught.value.errors[0]["reason"] == reason
    assert field in caught.value.errors[0]["message"], caught.value.errors[0]["message"]
    assert gce.names("") == [] and not gce.server.disks


def test_unknown_zones_images_and_networks_are_not_found(gce: Gce) -> None:
    with pytest.raises(api_exceptions.NotFound):
        gce.insert(zone="us-central1-z")
    with pytest.raises(api_exceptions.NotFound, match="images/family/nope"):
        gce.insert(disks=[{"boot": True,
                           "initialize_params": {"source_image": "projects/x/global/images/family/nope"}}])
    with pytest.raises(api_exceptions.NotFound, match="networks/elsewhere"):
        gce.insert(network_interfaces=[{"network": "global/networks/elsewhere"}])


def test_valid_gpu_spot_and_run_limit_settings_are_kept_as_the_api_returns_them(gce: Gce) -> None:
    inst = gce.create(name="gpu", machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
                      guest_accelerators=[{"accelerator_type": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4",
                                           "accelerator_count": 1}],
                      scheduling={"on_host_maintenance": "TERMINATE", "automatic_restart": False,
                                  "provisioning_model": "SPOT", "instance_termination_action": "STOP",
                                  "max_run_duration": {"seconds": 7200}})
    assert inst.guest_accelerators[0].accelerator_type.endswith(f"/zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4")
    scheduling = inst.scheduling
    assert (scheduling.provisioning_model, scheduling.on_host_maintenance, scheduling.automatic_restart,
            scheduling.instance_termination_action, scheduling.preemptible) == (
        "SPOT", "TERMINATE", False, "STOP", True)
    assert scheduling.max_run_duration.seconds == 7200
    builtin = gce.create(name="l4", machine_type=f"zones/{ZONE}/machineTypes/g2-standard-4",
                         scheduling={"on_host_maintenance": "TERMINATE"})
    assert not builtin.guest_accelerators  # the L4 comes with the machine type


def test_list_filters_work_as_documented(gce: Gce) -> None:
    gce.create(name="a1", labels={"cloudtrain-cluster": "one", "cloudtrain-owner": "me"})
    gce.create(name="a2", labels={"cloudtrain-cluster": "two", "cloudtrain-owner": "me"})
    gce.create("us-east1-b", name="b1", labels={"cloudtrain-cluster": "one", "cloudtrain-owner": "you"})
    gce.create(name="plain", labels={})
    assert gce.names('labels.cloudtrain-cluster = "one"') == ["a1", "b1"]
    assert gce.names('(labels.cloudtrain-cluster = "one") (labels.cloudtrain-owner = "me")') == ["a1"]
    assert gce.names("(labels.cloudtrain-cluster:*) (labels.cloudtrain-owner != you)") == ["a1", "a2"]
    assert gce.names('name eq "a.*"') == ["a1", "a2"]
    assert gce.names("(name ne a.*) (status eq RUNNING)") == ["b1", "plain"]
    zonal = gce.instances.list(request={"project": PROJECT, "zone": "us-east1-b",
                                        "filter": "labels.cloudtrain-cluster:*"})
    assert [i.name for i in zonal] == ["b1"]
    with pytest.raises(api_exceptions.BadRequest):
        gce.names('(name eq "a.*") (status = RUNNING)')  # the two syntaxes do not mix
    paged = gce.instances.list(request={"project": PROJECT, "zone": ZONE, "max_results": 1})
    assert [i.name for i in paged] == ["a1", "a2", "plain"]  # the pager follows nextPageToken


def test_machine_and_accelerator_types_say_where_they_are_sold(gce: Gce) -> None:
    def zones(client: Any, name: str) -> list[str]:
        pages = client.aggregated_list(request={"project": PROJECT, "filter": f'name = "{name}"'})
        field = "machine_types" if "Machine" in type(client).__name__ else "accelerator_types"
        return sorted(scope.split("/")[1] for scope, scoped in pages if getattr(scoped, field))

    machines, accelerators = gce.server.client("machine_types"), gce.server.client("accelerator_types")
    assert zones(accelerators, "nvidia-tesla-t4")[:4] == ["asia-east1-a", "asia-east1-c", "europe-west4-a",
                                                          "europe-west4-b"]
    assert "us-east1-b" not in zones(accelerators, "nvidia-tesla-t4")
    assert zones(machines, "a3-highgpu-8g") == zones(accelerators, "nvidia-h100-80gb")
    t4 = accelerators.get(project=PROJECT, zone=ZONE, accelerator_type="nvidia-tesla-t4")
    assert t4.maximum_cards_per_instance == 4 and t4.description == "NVIDIA T4"
    g2 = machines.get(project=PROJECT, zone=ZONE, machine_type="g2-standard-4")
    assert (g2.guest_cpus, g2.memory_mb, g2.accelerators[0].guest_accelerator_type) == (4, 16384, "nvidia-l4")
    image = gce.server.client("images").get_from_family(project="deeplearning-platform-release",
                                                         family="common-cu128-ubuntu-2204-nvidia-570")
    assert image.disk_size_gb == 50 and image.status == "READY"


def test_stockouts_come_as_done_operations_and_the_instance_is_gone(gce: Gce, gce_server: GceServer) -> None:
    gce_server.faults.add("ZONE_RESOURCE_POOL_EXHAUSTED", zones={ZONE})
    done = gce.wait(gce.insert())
    assert done.status == compute_v1.Operation.Status.DONE and done.http_error_status_code == 503
    (error,) = done.error.errors
    assert error.code == "ZONE_RESOURCE_POOL_EXHAUSTED"
    assert error.message.startswith(f"The zone 'projects/{PROJECT}/zones/{ZONE}' does not have enough resources")
    assert gce.names("") == [] and not gce_server.disks
    elsewhere = gce.create("us-central1-b")  # another zone is fine
    assert elsewhere.status == "RUNNING"
    assert gce_server.faults.count("instances.insert", zone=ZONE) == 1


def test_http_faults_answer_the_request_itself(gce: Gce, gce_server: GceServer) -> None:
    gce_server.faults.add("quotaExceeded", regions={"us-central1"}, times=1)
    gce_server.faults.add("forbidden", action="instances.delete")
    with pytest.raises(api_exceptions.Forbidden) as caught:
        gce.insert(machine_type=f"zones/{ZONE}/machineTypes/n1-standard-4",
                   guest_accelerators=[{"accelerator_type": f"zones/{ZONE}/acceleratorTypes/nvidia-tesla-t4",
                                        "accelerator_count": 1}], scheduling={"on_host_maintenance": "TERMINATE"})
    assert caught.value.errors[0]["reason"] == "quotaExceeded"
    assert "Quota 'NVIDIA_T4_GPUS' exceeded" in caught.value.errors[0]["message"]
    gce.create()  # times=1: the quota fault stepped aside
    with pytest.raises(api_exceptions.Forbidden, match="compute.instances.delete"):
        gce.instances.delete(project=PROJECT, zone=ZONE, instance="vm")
    assert gce.names("") == ["vm"]


def test_stop_start_delete_and_the_machine_behind(gce: Gce, gce_server: GceServer) -> None:
    events: list[tuple[str, str, str | None]] = []
    gce_server.machine_hooks.append(lambda event, inst: events.append((event, inst["name"], next(
        (c.get("natIP") for c in inst["networkInterfaces"][0]["accessConfigs"] if c.get("natIP")), None))))
    first = gce.create().network_interfaces[0].access_configs[0].nat_i_p
    gce_server.op_seconds = 600  # operations take their time until settled
    stop = gce.instances.stop(project=PROJECT, zone=ZONE, instance="vm")
    assert gce.instances.get(project=PROJECT, zone=ZONE, instance="vm").status == "STOPPING"
    gce_server.wait_seconds = 0.1
    assert gce.wait(stop).status != compute_v1.Operation.Status.DONE  # `wait` may return before the operation is done
    gce_server.settle()
    gce_server.op_seconds = 0
    assert gce.wait(stop).status == compute_v1.Operation.Status.DONE
    stopped = gce.instances.get(project=PROJECT, zone=ZONE, instance="vm")
    assert stopped.status == "TERMINATED" and not stopped.network_interfaces[0].access_configs[0].nat_i_p
    gce.wait(gce.instances.start(project=PROJECT, zone=ZONE, instance="vm"))
    again = gce.instances.get(project=PROJECT, zone=ZONE, instance="vm")
    second = again.network_interfaces[0].access_configs[0].nat_i_p
    assert second and second != first  # an ephemeral IP is new after a stop
    gce.wait(gce.instances.delete(project=PROJECT, zone=ZONE, instance="vm"))
    with pytest.raises(api_exceptions.NotFound):
        gce.instances.get(project=PROJECT, zone=ZONE, instance="vm")
    assert not gce_server.disks  # autoDelete
    assert events == [("boot", "vm", first), ("power_off", "vm", None), ("power_on", "vm", second),
                      ("power_off", "vm", second)]
    assert gce_server.authorized_keys({"metadata": {"items": [{"key": "ssh-keys", "value": f"me:{KEY}"}]}}) == [KEY]
    gce_server.project_metadata["enable-oslogin"] = "TRUE"  # metadata keys are ignored under OS Login ...
    assert gce_server.authorized_keys({"metadata": {"items": [{"key": "ssh-keys", "value": f"me:{KEY}"}]}}) == []
    assert gce_server.authorized_keys({"metadata": {"items": [  # ... unless the instance turns it off
        {"key": "ssh-keys", "value": f"me:{KEY}"}, {"key": "enable-oslogin", "value": "FALSE"}]}}) == [KEY]


def test_set_metadata_replaces_the_items_guarded_by_the_fingerprint(gce: Gce) -> None:
    created = gce.create()
    stale = compute_v1.Metadata(fingerprint="not-the-one", items=[compute_v1.Items(key="k", value="v")])
    with pytest.raises(api_exceptions.PreconditionFailed, match="fingerprint does not match"):
        gce.instances.set_metadata(project=PROJECT, zone=ZONE, instance="vm", metadata_resource=stale)
    fresh = compute_v1.Metadata(fingerprint=created.metadata.fingerprint, items=[
        *created.metadata.items, compute_v1.Items(key="cloudtrain-buckets", value="a b")])
    done = gce.wait(gce.instances.set_metadata(project=PROJECT, zone=ZONE, instance="vm", metadata_resource=fresh))
    assert done.status == compute_v1.Operation.Status.DONE and not done.error.errors
    after = gce.instances.get(project=PROJECT, zone=ZONE, instance="vm").metadata
    assert {(i.key, i.value) for i in after.items} >= {("cloudtrain-buckets", "a b"), ("ssh-keys", f"me:{KEY}")}
    assert after.fingerprint != created.metadata.fingerprint


def test_max_run_duration_and_preemption_follow_the_termination_action(gce: Gce, gce_server: GceServer) -> None:
    gce.create(name="limited", scheduling={"max_run_duration": {"seconds": 3600},
                                           "instance_termination_action": "STOP"})
    gce.create(name="gone", scheduling={"max_run_duration": {"seconds": 600}, "instance_termination_action": "DELETE"})
    gce.create(name="spot", scheduling={"provisioning_model": "SPOT", "automatic_restart": False,
                                        "instance_termination_action": "DELETE"})
    gce_server.advance(601)
    assert gce.names("") == ["limited", "spot"]
    gce_server.advance(3000)
    assert gce.instances.get(project=PROJECT, zone=ZONE, instance="limited").status == "TERMINATED"
    gce_server.preempt(ZONE, "spot")
    assert gce.names("") == ["limited"]
    with pytest.raises(ValueError):
        gce_server.preempt(ZONE, "limited")  # not a spot VM
    # What Compute Engine did by itself is listed (no request asked for it).
    assert gce_server.terminations == [(ZONE, "gone", "maxRunDuration"), (ZONE, "limited", "maxRunDuration"),
                                       (ZONE, "spot", "preemption")]
    assert gce_server.faults.count("instances.stop") == gce_server.faults.count("instances.delete") == 0


def test_firewalls_insert_list_patch_delete_and_what_they_admit(gce: Gce, gce_server: GceServer) -> None:
    def insert(**body: Any) -> Any:
        op = gce.firewalls.insert_unary(project=PROJECT, firewall_resource=compute_v1.Firewall(body))
        return gce.global_ops.wait(project=PROJECT, operation=op.name)

    assert insert(name="cloudtrain-x-ssh", description="ours", allowed=[{"I_p_protocol": "tcp", "ports": ["22"]}],
                  source_ranges=["203.0.113.7/32"], target_tags=["cloudtrain-x"]).status == compute_v1.Operation.Status.DONE
    insert(name="open-rule", allowed=[{"I_p_protocol": "tcp", "ports": ["80"]}])  # no source: the whole internet
    rule = gce.firewalls.get(project=PROJECT, firewall="open-rule")
    assert list(rule.source_ranges) == ["0.0.0.0/0"] and rule.network.endswith("/global/networks/default")
    listed = gce.firewalls.list(request={"project": PROJECT, "filter": 'name eq "cloudtrain-.*"'})
    assert [r.name for r in listed] == ["cloudtrain-x-ssh"]
    gce.global_ops.wait(project=PROJECT, operation=gce.firewalls.patch_unary(
        project=PROJECT, firewall="cloudtrain-x-ssh",
        firewall_resource=compute_v1.Firewall(source_ranges=["198.51.100.1/32"])).name)
    patched = gce.firewalls.get(project=PROJECT, firewall="cloudtrain-x-ssh")
    assert list(patched.source_ranges) == ["198.51.100.1/32"] and list(patched.target_tags) == ["cloudtrain-x"]
    assert gce_server.firewall_ranges_seen == {"203.0.113.7/32", "0.0.0.0/0", "198.51.100.1/32"}
    for bad in ({"name": "bad-proto", "allowed": [{"I_p_protocol": "tcpx"}]},
                {"name": "bad-port", "allowed": [{"I_p_protocol": "icmp", "ports": ["22"]}]},
                {"name": "bad-cidr", "allowed": [{"I_p_protocol": "tcp"}], "source_ranges": ["300.1.2.3/32"]},
                {"name": "Bad_Name", "allowed": [{"I_p_protocol": "tcp"}]},
                {"name": "nothing-allowed"}):
        with pytest.raises(api_exceptions.BadRequest):
            insert(**bad)
    with pytest.raises(api_exceptions.Conflict):
        insert(name="open-rule", allowed=[{"I_p_protocol": "tcp"}])
    gce.global_ops.wait(project=PROJECT, operation=gce.firewalls.delete_unary(project=PROJECT,
                                                                              firewall="open-rule").name)
    with pytest.raises(api_exceptions.NotFound):
        gce.firewalls.get(project=PROJECT, firewall="open-rule")


def test_gates_hold_an_answer_after_the_fake_acted(gce: Gce, gce_server: GceServer) -> None:
    import threading

    gate = gce_server.faults.hold("instances.insert", after=True)
    thread = threading.Thread(target=gce.insert, daemon=True)
    thread.start()
    assert gate.wait_held(timeout=30)
    assert [z for z, _ in gce_server.find_instances()] == [ZONE]  # created; its caller has not heard back
    gate.release()
    thread.join(timeout=30)
    assert not thread.is_alive()


COMPUTE = "https://www.googleapis.com/auth/compute"


def test_a_vms_metadata_token_may_act_only_on_an_instance_whose_account_and_scopes_allow_it(
    gce: Gce, gce_server: GceServer
) -> None:
    import requests

    from cloudtrain.testing.gcp import DEFAULT_SERVICE_ACCOUNT, SERVICE_ACCOUNT

    token = "ya29.fake-vm-token"
    gce_server.accept_metadata_token(token)
    gce.create(name="self", service_accounts=[{"email": "default", "scopes": [COMPUTE]}])
    gce.create(name="reader", service_accounts=[{"email": SERVICE_ACCOUNT,
                                                 "scopes": [COMPUTE + ".readonly"]}])
    gce.create(name="bare")
    # The API stores the default account's email, as Compute Engine resolves `default`.
    accounts = gce.instances.get(project=PROJECT, zone=ZONE, instance="self").service_accounts
    assert [(a.email, list(a.scopes)) for a in accounts] == [(DEFAULT_SERVICE_ACCOUNT, [COMPUTE])]
    assert not gce.instances.get(project=PROJECT, zone=ZONE, instance="bare").service_accounts
    headers = {"Authorization": f"Bearer {token}"}
    base = f"{gce_server.url}/compute/v1/projects/{PROJECT}/zones/{ZONE}/instances"

    def call(method: str, path: str = "") -> requests.Response:
        return requests.request(method, base + path, headers=headers, timeout=10)

    # No service account: no permission. A read-only scope reads but may not delete.
    bare = call("DELETE", "/bare")
    assert bare.status_code == 403 and bare.json()["error"]["errors"][0]["reason"] == "forbidden"
    assert "compute.instances.delete" in bare.json()["error"]["message"]
    assert call("GET", "/reader").status_code == 200
    reader = call("DELETE", "/reader")
    assert reader.status_code == 403 and reader.json()["error"]["message"] == (
        "Request had insufficient authentication scopes.")
    # Nothing but one instance: the token stands for the identity of the instance it acts on.
    assert call("GET").status_code == 403
    assert requests.get(f"{gce_server.url}/compute/v1/projects/{PROJECT}/zones", headers=headers,
                        timeout=10).status_code == 403
    # The compute scope deletes; the operation finishes like any other, the machine goes.
    events: list[tuple[str, str]] = []
    gce_server.machine_hooks.append(lambda event, inst: events.append((event, inst["name"])))
    deleted = call("DELETE", "/self")
    assert deleted.status_code == 200 and deleted.json()["operationType"] == "delete"
    assert gce_server.instance(ZONE, "self") is None and events == [("power_off", "self")]
    assert call("DELETE", "/self").status_code == 404  # gone: what the watchdog takes as done
    (seen,) = [r for r in gce_server.faults.seen("instances.delete") if r.name == "self" and r.caller]
    assert (seen.bearer, seen.caller) == (token, DEFAULT_SERVICE_ACCOUNT)
    assert {r.name for r in gce_server.faults.seen("instances.delete")} == {"bare", "reader", "self"}
    assert {z_i[1]["name"] for z_i in gce_server.find_instances()} == {"reader", "bare"}
    # A token nobody registered is no credential at all.
    gce_server.forget_metadata_token(token)
    assert call("DELETE", "/reader").status_code == 401


@pytest.mark.parametrize(("accounts", "fragment"), [
    ([{"email": "default", "scopes": [COMPUTE]}, {"email": "default", "scopes": [COMPUTE]}], "At most one"),
    ([{"email": "default", "scopes": ["compute"]}], "scopes[0]"),
    ([{"email": "someone@other.iam.gserviceaccount.com", "scopes": [COMPUTE]}], "does not have access"),
])
def test_service_accounts_are_validated_like_the_api(gce: Gce, accounts: list, fragment: str) -> None:
    with pytest.raises(api_exceptions.BadRequest) as caught:
        gce.insert(name="sa", service_accounts=accounts)
    assert fragment in caught.value.message
    assert gce.server.instance(ZONE, "sa") is None
