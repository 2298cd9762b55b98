"""The AWS provider against moto's server over HTTP, through the real boto3 client.

Nothing of cloudtrain is mocked: faults are injected in the server (testing/aws.py), and every
assertion about what exists reads moto's state through the EC2 API.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from cloudtrain.config import AwsConfig, Config
from cloudtrain.errors import CapacityError, CredentialsError, ProviderError, UsageError
from cloudtrain.providers import get_provider
from cloudtrain.providers.aws import AwsCapacityError, AwsProvider
from cloudtrain.providers.aws.api import NO_CREDENTIALS
from cloudtrain.providers.base import (
    TAG_CLUSTER,
    TAG_OWNER,
    Backend,
    CreatesMachines,
    InstanceSpec,
    InstanceState,
    SelfStopping,
    StopsMachines,
    owner_id,
    supports,
)
from cloudtrain.testing.aws import MotoServer, isolate_aws_env

pytestmark = pytest.mark.quick

REGION = "us-east-1"
CIDR = "203.0.113.7/32"


def _public_key() -> str:
    key = ed25519.Ed25519PrivateKey.generate().public_key()
    return key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode() + " test@ct"


PUBLIC_KEY = _public_key()


@pytest.fixture
def aws(moto_server: MotoServer) -> AwsProvider:
    # Two regions keep list_tagged/lookup sweeps cheap; retries bounded so injected 500s are quick.
    return AwsProvider(region=REGION, regions=(REGION, "us-west-2"), max_attempts=1)


@pytest.fixture
def ec2(moto_server: MotoServer) -> Any:
    return moto_server.client("ec2", REGION)


def spec(moto_server: MotoServer, **overrides: Any) -> InstanceSpec:
    fields: dict[str, Any] = dict(
        cluster=f"t-{uuid.uuid4().hex[:10]}",
        owner=owner_id(),
        instance_type="g4dn.xlarge",
        region=REGION,
        image=moto_server.ami(overrides.get("region", REGION)),
        ssh_public_key=PUBLIC_KEY,
        allowed_cidr=CIDR,
    )
    fields.update(overrides)
    return InstanceSpec(**fields)


def leftovers(ec2: Any, cluster: str) -> dict[str, list[str]]:
    """Everything of `cluster` that still exists (terminated instances do not count)."""
    tag = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
    live = {"Name": "instance-state-name", "Values": ["pending", "running", "stopping", "stopped"]}
    instances = [
        i["InstanceId"] for r in ec2.describe_instances(Filters=[*tag, live])["Reservations"] for i in r["Instances"]
    ]
    keys = [k["KeyName"] for k in ec2.describe_key_pairs(Filters=tag)["KeyPairs"]]
    groups = [g["GroupId"] for g in ec2.describe_security_groups(Filters=tag)["SecurityGroups"]]
    return {"instances": instances, "key_pairs": keys, "security_groups": groups}


NOTHING = {"instances": [], "key_pairs": [], "security_groups": []}


def test_registry_builds_a_provider_that_meets_the_protocol(moto_server: MotoServer) -> None:
    provider = get_provider("aws", Config(aws=AwsConfig(region="eu-west-1")))
    assert isinstance(provider, AwsProvider) and isinstance(provider, Backend)
    assert provider.default_region == "eu-west-1"
    assert provider.regions()[0] == "eu-west-1"
    assert provider.traits.remote and provider.traits.priced and not provider.traits.stops_spot
    assert all(supports(provider, c) for c in (CreatesMachines, StopsMachines, SelfStopping))


def test_importing_the_provider_does_not_import_boto3() -> None:
    code = "import sys, cloudtrain.providers.aws, cloudtrain.plan; assert 'boto3' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_launch_tags_every_resource_and_opens_ssh_to_one_address(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    s = spec(moto_server, disk_gb=60)
    launched = aws.launch(s, 2)

    assert len(launched) == 2
    ids = [i.id for i in launched]
    described = aws.describe(ids)
    assert [i.state for i in described] == [InstanceState.RUNNING] * 2
    first = described[0]
    placed = (first.cluster, first.region, first.zone, first.instance_type)
    assert placed == (s.cluster, REGION, "us-east-1a", "g4dn.xlarge")
    assert first.public_ip and first.private_ip and first.ssh_user == "ubuntu"
    assert first.launched_at  # prices come from the plan (one source), not the provider

    raw = [i for r in ec2.describe_instances(InstanceIds=ids)["Reservations"] for i in r["Instances"]]
    want = {TAG_CLUSTER: s.cluster, TAG_OWNER: s.owner}
    for inst in raw:
        assert {t["Key"]: t["Value"] for t in inst["Tags"]} == want
        assert inst["KeyName"] == f"cloudtrain-{s.cluster}"
        attr = ec2.describe_instance_attribute(
            InstanceId=inst["InstanceId"], Attribute="instanceInitiatedShutdownBehavior"
        )
        assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "stop"
    volumes = ec2.describe_volumes(Filters=[{"Name": "attachment.instance-id", "Values": ids}])["Volumes"]
    assert len(volumes) == 2
    for volume in volumes:
        assert {t["Key"]: t["Value"] for t in volume["Tags"]} == want
        assert volume["Size"] == 60

    (key,) = ec2.describe_key_pairs(KeyNames=[f"cloudtrain-{s.cluster}"], IncludePublicKey=True)["KeyPairs"]
    assert {t["Key"]: t["Value"] for t in key["Tags"]} == want
    assert key["PublicKey"].split()[:2] == PUBLIC_KEY.split()[:2]

    assert [g["GroupName"] for g in raw[0]["SecurityGroups"]] == [f"cloudtrain-{s.cluster}"]
    (group,) = ec2.describe_security_groups(GroupIds=[raw[0]["SecurityGroups"][0]["GroupId"]])["SecurityGroups"]
    assert group["GroupName"] == f"cloudtrain-{s.cluster}"
    assert {t["Key"]: t["Value"] for t in group["Tags"]} == want
    ssh = [p for p in group["IpPermissions"] if p["IpProtocol"] == "tcp"]
    assert [(p["FromPort"], p["ToPort"], [r["CidrIp"] for r in p["IpRanges"]]) for p in ssh] == [(22, 22, [CIDR])]
    others = [p for p in group["IpPermissions"] if p["IpProtocol"] != "tcp"]
    # The only other rule: nodes of the cluster reach each other (multi-node training), no CIDR.
    assert [(p["IpProtocol"], p["IpRanges"], [g["GroupId"] for g in p["UserIdGroupPairs"]]) for p in others] == [
        ("-1", [], [group["GroupId"]])
    ]
    aws.terminate(ids)


def test_stop_and_start_report_states_and_the_new_public_ip(aws: AwsProvider, moto_server: MotoServer) -> None:
    (inst,) = aws.launch(spec(moto_server, instance_type="t3.medium"), 1)
    aws.stop([inst.id])
    (stopped,) = aws.describe([inst.id])
    assert stopped.state is InstanceState.STOPPED and stopped.public_ip is None
    aws.stop([inst.id])  # already stopped: nothing to do, no error

    aws.start([inst.id])
    (started,) = aws.describe([inst.id])
    assert started.state is InstanceState.RUNNING and started.public_ip
    aws.terminate([inst.id])


def test_terminate_is_idempotent_and_removes_key_pair_and_security_group(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    s = spec(moto_server, instance_type="t3.medium")
    ids = [i.id for i in aws.launch(s, 2)]
    assert leftovers(ec2, s.cluster)["key_pairs"] and leftovers(ec2, s.cluster)["security_groups"]

    aws.terminate([ids[0]])
    # One node still uses them: key pair and group stay.
    left = leftovers(ec2, s.cluster)
    assert left["instances"] == [ids[1]] and left["key_pairs"] and left["security_groups"]

    aws.terminate([*ids, "i-0123456789abcdef0"])  # already gone and never existed: both success
    assert leftovers(ec2, s.cluster) == NOTHING
    assert [i.state for i in aws.describe(ids)] == [InstanceState.TERMINATED] * 2
    aws.terminate(ids)
    assert aws.describe(["i-0fffffffffffffff0"])[0].state is InstanceState.TERMINATED


def test_list_tagged_filters_by_cluster_and_owner_across_regions(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    east = spec(moto_server, instance_type="t3.medium")
    west = spec(moto_server, instance_type="t3.medium", region="us-west-2", cluster=east.cluster)
    other = spec(moto_server, instance_type="t3.medium")
    stranger = spec(moto_server, instance_type="t3.medium", owner="someone-else")
    ids = {
        "east": aws.launch(east, 1)[0].id,
        "west": aws.launch(west, 1)[0].id,
        "other": aws.launch(other, 1)[0].id,
        "stranger": aws.launch(stranger, 1)[0].id,
    }

    mine = {i.id: i for i in aws.list_tagged(east.cluster)}
    assert set(mine) == {ids["east"], ids["west"]}
    assert mine[ids["west"]].region == "us-west-2"
    everything = {i.id for i in aws.list_tagged()}
    assert {ids["east"], ids["west"], ids["other"]} <= everything and ids["stranger"] not in everything
    everyone = AwsProvider(region=REGION, regions=(REGION,), all_owners=True)
    assert ids["stranger"] in {i.id for i in everyone.list_tagged()}

    # A fresh provider (a new CLI process) finds an instance by id in whichever region it is.
    fresh = AwsProvider(region=REGION, regions=(REGION, "us-west-2"))
    (found,) = fresh.describe([ids["west"]])
    assert (found.region, found.state) == ("us-west-2", InstanceState.RUNNING)

    aws.terminate(list(ids.values()))
    assert aws.list_tagged(east.cluster) == []
    assert leftovers(ec2, east.cluster) == NOTHING
    assert leftovers(moto_server.client("ec2", "us-west-2"), east.cluster) == NOTHING


def test_capacity_error_in_first_zone_lands_in_the_next(aws: AwsProvider, moto_server: MotoServer) -> None:
    moto_server.faults.add("InsufficientInstanceCapacity", zones={"us-east-1a"})
    (inst,) = aws.launch(spec(moto_server), 1)
    assert inst.zone == "us-east-1b"
    assert moto_server.faults.count("RunInstances", zone="us-east-1a") == 1
    assert moto_server.faults.count("RunInstances", zone="us-east-1b") == 1
    aws.terminate([inst.id])


def test_capacity_error_in_every_zone_raises_and_leaves_nothing(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    moto_server.faults.add("InsufficientInstanceCapacity", regions={REGION})
    s = spec(moto_server)
    with pytest.raises(AwsCapacityError) as caught:
        aws.launch(s, 2)
    err = caught.value
    assert isinstance(err, CapacityError)
    # g4dn.xlarge is offered in five of us-east-1's six zones (not 1e): those five were tried, in order.
    zones = ["us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"]
    assert [a.zone for a in err.attempts] == zones
    assert {a.code for a in err.attempts} == {"InsufficientInstanceCapacity"}
    assert err.region == REGION and all(z in err.one_line() for z in zones)
    assert "\n" not in err.one_line()
    assert leftovers(ec2, s.cluster) == NOTHING


def test_regional_quota_error_ends_the_region_without_trying_other_zones(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    moto_server.faults.add("VcpuLimitExceeded", regions={REGION}, status=400)
    s = spec(moto_server)
    with pytest.raises(AwsCapacityError) as caught:
        aws.launch(s, 1)
    assert [(a.zone, a.code) for a in caught.value.attempts] == [("us-east-1a", "VcpuLimitExceeded")]
    assert moto_server.faults.count("RunInstances", region=REGION) == 1
    assert leftovers(ec2, s.cluster) == NOTHING


def test_given_zone_is_the_only_zone_tried(aws: AwsProvider, moto_server: MotoServer) -> None:
    (inst,) = aws.launch(spec(moto_server, zone="us-east-1c"), 1)
    assert inst.zone == "us-east-1c"
    aws.terminate([inst.id])
    moto_server.faults.add("InsufficientInstanceCapacity", zones={"us-east-1c"})
    with pytest.raises(AwsCapacityError) as caught:
        aws.launch(spec(moto_server, zone="us-east-1c"), 1)
    assert [a.zone for a in caught.value.attempts] == ["us-east-1c"]


def test_type_not_offered_in_the_region_is_a_capacity_error_before_creating_anything(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    s = spec(moto_server, instance_type="p3.2xlarge")  # moto, like some regions, has no p3 offerings
    with pytest.raises(AwsCapacityError, match="not offered in any zone"):
        aws.launch(s, 1)
    assert moto_server.faults.count("RunInstances") == 0
    assert leftovers(ec2, s.cluster) == NOTHING


def test_botocore_retries_a_momentary_500_in_the_same_zone(moto_server: MotoServer) -> None:
    # EC2 answers capacity errors with HTTP 500; botocore retries them (same ClientToken).
    aws = AwsProvider(region=REGION, regions=(REGION,), max_attempts=2)
    moto_server.faults.add("InsufficientInstanceCapacity", zones={"us-east-1a"}, times=1)
    (inst,) = aws.launch(spec(moto_server), 1)
    assert inst.zone == "us-east-1a"
    assert moto_server.faults.count("RunInstances", zone="us-east-1a") == 2
    aws.terminate([inst.id])


def test_other_launch_errors_clean_up_and_name_the_call(aws: AwsProvider, ec2: Any, moto_server: MotoServer) -> None:
    moto_server.faults.add("InvalidParameterCombination", message="bad combination", status=400)
    s = spec(moto_server)
    with pytest.raises(ProviderError, match="RunInstances|run_instances") as caught:
        aws.launch(s, 1)
    assert "InvalidParameterCombination: bad combination" in caught.value.one_line()
    assert not isinstance(caught.value, CapacityError)
    assert leftovers(ec2, s.cluster) == NOTHING


def test_spot_launch_uses_spot_market_and_cannot_stop(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    (inst,) = aws.launch(spec(moto_server, spot=True), 1)
    (raw,) = [i for r in ec2.describe_instances(InstanceIds=[inst.id])["Reservations"] for i in r["Instances"]]
    assert raw["InstanceLifecycle"] == "spot"
    attr = ec2.describe_instance_attribute(InstanceId=inst.id, Attribute="instanceInitiatedShutdownBehavior")
    assert attr["InstanceInitiatedShutdownBehavior"]["Value"] == "terminate"
    with pytest.raises(ProviderError, match="spot"):
        aws.stop([inst.id])
    aws.terminate([inst.id])


def test_image_from_an_ssm_parameter(aws: AwsProvider, ec2: Any, moto_server: MotoServer) -> None:
    ami = moto_server.ami()
    moto_server.client("ssm").put_parameter(Name="/cloudtrain-test/gpu-ami", Value=ami, Type="String", Overwrite=True)
    (inst,) = aws.launch(spec(moto_server, image="resolve:ssm:/cloudtrain-test/gpu-ami"), 1)
    (raw,) = [i for r in ec2.describe_instances(InstanceIds=[inst.id])["Reservations"] for i in r["Instances"]]
    assert raw["ImageId"] == ami
    aws.terminate([inst.id])


def test_default_image_missing_and_bad_images_fail_before_creating_anything(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    s = spec(moto_server, image=None)
    # moto has neither the public Deep Learning AMI parameter nor a matching image to search.
    with pytest.raises(ProviderError, match="deeplearning") as caught:
        aws.launch(s, 1)
    assert "resources.image" in caught.value.one_line()
    with pytest.raises(UsageError, match="ami-0000000000000000f not found"):
        aws.launch(spec(moto_server, image="ami-0000000000000000f"), 1)
    with pytest.raises(UsageError, match="not found in us-east-1"):
        aws.launch(spec(moto_server, image="resolve:ssm:/cloudtrain-test/missing"), 1)
    with pytest.raises(UsageError, match="expected an AMI id"):
        aws.launch(spec(moto_server, image="ubuntu"), 1)
    assert moto_server.faults.count("RunInstances") == 0
    assert leftovers(ec2, s.cluster) == NOTHING


def test_ingress_cidr_is_required_and_the_open_internet_warns(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    with pytest.raises(UsageError, match="ssh.allowed_cidr"):
        aws.launch(spec(moto_server, allowed_cidr=None), 1)
    with pytest.raises(UsageError, match="not a CIDR"):
        aws.launch(spec(moto_server, allowed_cidr="my-laptop"), 1)
    with caplog.at_level(logging.WARNING, logger="cloudtrain.providers.aws"):
        (inst,) = aws.launch(spec(moto_server, instance_type="t3.medium", allowed_cidr="0.0.0.0/0"), 1)
    assert "whole internet" in caplog.text
    aws.terminate([inst.id])


def test_relaunch_reuses_key_pair_and_moves_ssh_to_the_new_address(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer
) -> None:
    first = spec(moto_server, instance_type="t3.medium")
    a = aws.launch(first, 1)[0]
    second = spec(moto_server, instance_type="t3.medium", cluster=first.cluster, allowed_cidr="198.51.100.9/32")
    b = aws.launch(second, 1)[0]
    by_name = [{"Name": "group-name", "Values": [f"cloudtrain-{first.cluster}"]}]
    (group,) = ec2.describe_security_groups(Filters=by_name)["SecurityGroups"]
    ssh = [r["CidrIp"] for p in group["IpPermissions"] if p["IpProtocol"] == "tcp" for r in p["IpRanges"]]
    assert ssh == ["198.51.100.9/32"]
    # A different public key while instances use the key pair would lock them out: refused.
    with pytest.raises(ProviderError, match="another public key"):
        aws.launch(spec(moto_server, instance_type="t3.medium", cluster=first.cluster, ssh_public_key=_public_key()), 1)
    aws.terminate([a.id, b.id])
    assert leftovers(ec2, first.cluster) == NOTHING


def test_stop_or_start_of_unknown_instances_is_an_error(aws: AwsProvider, moto_server: MotoServer) -> None:
    with pytest.raises(ProviderError, match="i-0123456789abcdef1"):
        aws.stop(["i-0123456789abcdef1"])
    with pytest.raises(ProviderError, match="no such live instance"):
        aws.start(["i-0123456789abcdef1"])


def test_list_and_release_resources(aws: AwsProvider, ec2: Any, moto_server: MotoServer) -> None:
    # A crash after the key pair and group were made, before RunInstances: gc finds and removes them.
    s = spec(moto_server)
    moto_server.faults.add("InsufficientInstanceCapacity", regions={REGION})
    with pytest.raises(CapacityError):
        aws.launch(s, 1)
    ec2.import_key_pair(
        KeyName=f"cloudtrain-{s.cluster}", PublicKeyMaterial=PUBLIC_KEY.encode(),
        TagSpecifications=[{"ResourceType": "key-pair", "Tags": [{"Key": TAG_CLUSTER, "Value": s.cluster},
                                                                  {"Key": TAG_OWNER, "Value": s.owner}]}],
    )
    found = aws.list_resources()
    assert {(r.cluster, r.kind, r.region) for r in found} >= {(s.cluster, "key-pair", REGION)}
    assert all(r.cluster == s.cluster for r in aws.list_resources(s.cluster))
    assert aws.release_resources(s.cluster) == []
    assert s.cluster not in {r.cluster for r in aws.list_resources()}


def test_check_credentials_names_source_account_and_region(moto_server: MotoServer) -> None:
    status = AwsProvider(region=REGION).check_credentials()
    assert status.ok and status.cloud == "aws"
    assert status.detail == "credentials from environment variables, account 123456789012, region us-east-1"


def test_no_credentials_check_says_so_and_launch_refuses(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    env = {k: v for k, v in moto_server.env().items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    isolate_aws_env(monkeypatch, tmp_path, env)
    provider = AwsProvider(region=REGION)
    status = provider.check_credentials()
    assert not status.ok
    assert status.detail == NO_CREDENTIALS and "\n" not in status.detail
    with pytest.raises(CredentialsError) as caught:
        provider.launch(spec(moto_server), 1)
    assert caught.value.one_line() == NO_CREDENTIALS
    assert moto_server.faults.count("RunInstances") == 0


def test_unknown_profile_is_a_credentials_problem(moto_server: MotoServer) -> None:
    status = AwsProvider(region=REGION, profile="nope").check_credentials()
    assert not status.ok and "nope" in status.detail
    with pytest.raises(CredentialsError, match="nope"):
        AwsProvider(region=REGION, profile="nope").list_tagged()


def test_group_still_attached_while_shutting_down_is_left_for_the_next_terminate(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    # Real EC2 refuses to delete a group while its instances shut down; moto deletes at once.
    s = spec(moto_server, instance_type="t3.medium")
    (inst,) = aws.launch(s, 1)
    moto_server.faults.add("DependencyViolation", action="DeleteSecurityGroup", status=400,
                           message="resource sg-x has a dependent object")
    with caplog.at_level(logging.WARNING, logger="cloudtrain.providers.aws"):
        aws.terminate([inst.id])  # no error: terminating worked, the group is reported and kept
    assert "instances still shutting down" in caplog.text and f"cloudtrain down {s.cluster}" in caplog.text
    left = leftovers(ec2, s.cluster)
    assert left["instances"] == [] and left["key_pairs"] == [] and len(left["security_groups"]) == 1

    moto_server.faults.clear()
    aws.terminate([inst.id])  # the later `down`: the terminated instance still names its cluster
    assert leftovers(ec2, s.cluster) == NOTHING


def test_rejected_credentials_are_credentials_errors(aws: AwsProvider, moto_server: MotoServer) -> None:
    moto_server.faults.add("AuthFailure", action="DescribeInstances", status=401,
                           message="AWS was not able to validate the provided access credentials")
    with pytest.raises(CredentialsError, match="AuthFailure"):
        aws.list_tagged()


def test_a_broken_credential_chain_is_reported_not_raised(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    config = tmp_path / "aws-config"
    config.write_text("[default]\ncredential_process = /bin/false\n")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    provider = AwsProvider(region=REGION)
    status = provider.check_credentials()
    assert not status.ok and status.detail.startswith("AWS credentials could not be loaded")
    with pytest.raises(CredentialsError, match="could not be loaded"):
        provider.launch(spec(moto_server), 1)


def test_a_new_instance_profile_is_waited_for_until_ec2_takes_it(
    aws: AwsProvider, ec2: Any, moto_server: MotoServer, caplog: pytest.LogCaptureFixture
) -> None:
    """IAM is eventually consistent: EC2 refuses a just-created instance profile for a few seconds
    (the fake models it from moto's own creation time). A first launch with bucket access must wait
    that out, saying what it waits for, not fail."""
    from cloudtrain.buckets.grants import grants_for

    assert moto_server.faults is not None and moto_server.faults.profile_propagation_s > 0
    s = spec(moto_server, buckets=tuple(grants_for(["s3://data-bkt/train"], None)))
    with caplog.at_level(logging.WARNING, logger="cloudtrain"):
        (launched,) = aws.launch(s, 1)
    refused = [r for r in moto_server.faults.requests if r.action == "RunInstances"]
    assert len(refused) >= 2  # at least one refusal, then the launch
    assert any("waiting for the new IAM instance profile" in m for m in caplog.messages)
    (raw,) = [i for r in ec2.describe_instances(InstanceIds=[launched.id])["Reservations"] for i in r["Instances"]]
    assert raw["IamInstanceProfile"]["Arn"].endswith(f"/cloudtrain-{s.cluster}")
    aws.terminate([launched.id])
    aws.release_resources(s.cluster)


def test_mark_alive_renews_the_tag_every_listing_reads(aws: AwsProvider, moto_server: MotoServer) -> None:
    from cloudtrain.providers.base import TAG_ALIVE, MarksAlive

    assert supports(aws, MarksAlive)
    (inst,) = aws.launch(spec(moto_server, tags={TAG_ALIVE: "1000"}), 1)
    assert aws.describe([inst.id])[0].alive_at == 1000.0  # the launch request's mark
    aws.mark_alive([inst.id, "i-0123456789abcdef0"], 2_000_000_000.5)  # a gone one is skipped
    assert [i.alive_at for i in aws.list_tagged(inst.cluster)] == [2_000_000_000.0]
    aws.terminate([inst.id])
    aws.mark_alive([inst.id], 2_000_000_100)  # terminated: nothing to vouch for, no error
