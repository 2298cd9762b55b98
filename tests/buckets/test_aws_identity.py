"""The AWS node identity's policy, and its role's life against moto's IAM (real boto3, HTTP)."""

import json

import pytest

from cloudtrain.buckets.grants import grants_for
from cloudtrain.providers.aws.identity import policy_document

POLICY_CASES = [
    (["s3://data-bkt/train"], None, [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::data-bkt"},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::data-bkt/train/*"},
    ]),
    (["s3://whole-bkt", "gs://gcs-bkt/x"], "s3://out-bkt/runs", [
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::whole-bkt"},
        {"Effect": "Allow", "Action": ["s3:GetObject"], "Resource": "arn:aws:s3:::whole-bkt/*"},
        {"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": "arn:aws:s3:::out-bkt"},
        {"Effect": "Allow", "Action": ["s3:GetObject", "s3:PutObject", "s3:AbortMultipartUpload"],
         "Resource": "arn:aws:s3:::out-bkt/runs/*"},
    ]),
]


@pytest.mark.parametrize("sources, upload, statements", POLICY_CASES)
def test_policy_names_exactly_the_buckets(sources: list[str], upload: str | None, statements: list[dict]) -> None:
    assert policy_document(grants_for(sources, upload))["Statement"] == statements


def test_role_created_listed_and_released(moto_server) -> None:  # noqa: ANN001
    from cloudtrain.providers.aws import AwsProvider
    from cloudtrain.providers.aws.identity import ensure_node_role, release_node_role, role_name
    from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER

    provider = AwsProvider("us-east-1", all_owners=True)
    grants = grants_for(["s3://data-bkt/train"], None)
    tags = {TAG_CLUSTER: "idtest-a", TAG_OWNER: "someone"}
    profile = ensure_node_role(provider.api, "us-east-1", "idtest-a", tags, grants)
    assert ensure_node_role(provider.api, "us-east-1", "idtest-a", tags, grants) == profile  # idempotent
    iam = moto_server.client("iam")
    policy = iam.get_role_policy(RoleName=role_name("idtest-a"), PolicyName="cloudtrain-buckets")["PolicyDocument"]
    policy = json.loads(policy) if isinstance(policy, str) else policy
    assert policy["Statement"][1]["Resource"] == "arn:aws:s3:::data-bkt/train/*"
    assert [r.id for r in provider.list_resources("idtest-a") if r.kind == "iam-role"] == ["cloudtrain-idtest-a"]
    assert provider.release_resources("idtest-a") == []
    assert [r for r in provider.list_resources("idtest-a") if r.kind == "iam-role"] == []
    release_node_role(provider.api, "us-east-1", "idtest-a")  # gone is success


def test_gc_finds_and_removes_the_role_of_a_cluster_state_lost(aws_cloud) -> None:  # noqa: ANN001
    """A role left behind (its cluster's state gone): `gc` lists it, `gc --yes` removes it."""
    from cloudtrain.providers.aws import AwsProvider
    from cloudtrain.providers.aws.identity import ensure_node_role
    from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER

    lost = aws_cloud.new_cluster("lostrole")
    provider = AwsProvider("us-east-1", all_owners=True)
    tags = {TAG_CLUSTER: lost, TAG_OWNER: "someone-else"}
    ensure_node_role(provider.api, "us-east-1", lost, tags, grants_for(["s3://data-bkt/x"], None))
    listed = aws_cloud.cli("gc", "--cloud", "aws", "--all-owners")
    assert listed.returncode == 1, listed.output
    (line,) = [x for x in listed.output.splitlines() if f"cloudtrain-{lost}" in x]
    assert "iam-role" in line and "$0" in line
    removed = aws_cloud.cli("gc", "--cloud", "aws", "--all-owners", "--yes")
    assert removed.returncode == 0, removed.output
    roles = [r["RoleName"] for r in aws_cloud.server.client("iam").list_roles(PathPrefix="/cloudtrain/")["Roles"]]
    assert f"cloudtrain-{lost}" not in roles


def test_a_reused_cluster_gets_this_recipes_buckets(moto_server) -> None:  # noqa: ANN001
    """An instance launched without buckets gets the profile; the policy names only the new buckets."""
    from cloudtrain.providers.aws import AwsProvider
    from cloudtrain.providers.aws.identity import role_name

    provider = AwsProvider("us-east-1", all_owners=True)
    ec2 = moto_server.client("ec2")
    instance = ec2.run_instances(ImageId=moto_server.ami(), MinCount=1, MaxCount=1,
                                 InstanceType="t3.micro")["Instances"][0]["InstanceId"]
    try:
        provider.grant_buckets("idtest-b", [instance], grants_for(["s3://first-bkt/a"], None))
        provider.grant_buckets("idtest-b", [instance], grants_for(["s3://second-bkt/b"], "s3://out-bkt/r"))
        raw = ec2.describe_instances(InstanceIds=[instance])["Reservations"][0]["Instances"][0]
        assert raw["IamInstanceProfile"]["Arn"].endswith(f"/{role_name('idtest-b')}")
        policy = moto_server.client("iam").get_role_policy(RoleName=role_name("idtest-b"),
                                                            PolicyName="cloudtrain-buckets")["PolicyDocument"]
        named = json.dumps(policy)
        assert "second-bkt" in named and "out-bkt" in named and "first-bkt" not in named
    finally:
        ec2.terminate_instances(InstanceIds=[instance])
        provider.release_resources("idtest-b")
