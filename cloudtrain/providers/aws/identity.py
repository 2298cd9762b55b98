"""The identity an EC2 node reads and writes its buckets with: an IAM role and instance profile per
cluster, allowed exactly the recipe's buckets (docs/data.md).

The role trusts only EC2, carries one inline policy built from the recipe's bucket grants, and is
tagged like every cluster resource; it lives under the IAM path /cloudtrain/ so `gc` lists ours
with one call. The instance's software gets the role's short-lived credentials from the instance
metadata service: no user credential is ever copied to the VM.

The launching credentials need iam:CreateRole, iam:PutRolePolicy, iam:CreateInstanceProfile,
iam:AddRoleToInstanceProfile, iam:PassRole and iam:TagRole (and the matching deletes for `down`).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping, Sequence
from typing import Any

from cloudtrain.buckets.grants import BucketGrant
from cloudtrain.buckets.url import Store
from cloudtrain.providers.base import TAG_CLUSTER, TAG_OWNER, ClusterResource
from cloudtrain.providers.aws.api import AwsApiError, Ec2Api

log = logging.getLogger(__name__)

ROLE_PATH = "/cloudtrain/"
# How long an EC2 call waits for a new instance profile to reach EC2 (typically 5-15 s).
PROFILE_PROPAGATION_S = 60
POLICY_NAME = "cloudtrain-buckets"
_TRUST = {"Version": "2012-10-17", "Statement": [
    {"Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"}, "Action": "sts:AssumeRole"}]}
_GONE = ("NoSuchEntity",)
_DENIED = ("AccessDenied", "AccessDeniedException", "UnauthorizedOperation")


def role_name(cluster: str) -> str:
    """Also the instance profile's name (cluster names are at most 40 characters: IAM allows 64)."""
    return f"cloudtrain-{cluster}"


def policy_document(grants: Sequence[BucketGrant], partition: str = "aws") -> dict[str, Any]:
    """An IAM policy allowing exactly `grants` (their S3 ones): ListBucket on each bucket, and
    GetObject (PutObject for uploads) on the objects under its prefix only. (Listing is not
    confined to the prefix: an s3:prefix StringLike condition would do it on AWS, but the test
    fake's policy evaluator knows StringEquals only, and a policy we cannot test is not shipped.)"""
    statements: list[dict[str, Any]] = []
    for grant in grants:
        if grant.url.store is not Store.S3:
            continue
        bucket_arn = f"arn:{partition}:s3:::{grant.url.bucket}"
        prefix = grant.url.prefix
        statements.append({"Effect": "Allow", "Action": ["s3:ListBucket"], "Resource": bucket_arn})
        actions = ["s3:GetObject"] + (["s3:PutObject", "s3:AbortMultipartUpload"] if grant.write else [])
        statements.append({"Effect": "Allow", "Action": actions,
                           "Resource": f"{bucket_arn}/{prefix}/*" if prefix else f"{bucket_arn}/*"})
    return {"Version": "2012-10-17", "Statement": statements}


def ensure_node_role(api: Ec2Api, region: str, cluster: str, tags: Mapping[str, str],
                     grants: Sequence[BucketGrant]) -> str:
    """The cluster's role and instance profile with this recipe's policy; returns the profile name.
    Idempotent: a relaunch of the same cluster updates the policy in place."""
    name = role_name(cluster)
    tag_list = [{"Key": k, "Value": v} for k, v in sorted(tags.items())]
    try:
        api.call("iam", region, "create_role", RoleName=name, Path=ROLE_PATH, Tags=tag_list,
                 AssumeRolePolicyDocument=json.dumps(_TRUST),
                 Description=f"cloudtrain cluster {cluster}: its nodes' access to the recipe's buckets")
    except AwsApiError as exc:
        if exc.code != "EntityAlreadyExists":
            raise
    api.call("iam", region, "put_role_policy", RoleName=name, PolicyName=POLICY_NAME,
             PolicyDocument=json.dumps(policy_document(grants)))
    try:
        api.call("iam", region, "create_instance_profile", InstanceProfileName=name, Path=ROLE_PATH, Tags=tag_list)
    except AwsApiError as exc:
        if exc.code != "EntityAlreadyExists":
            raise
    profile = api.call("iam", region, "get_instance_profile", InstanceProfileName=name)["InstanceProfile"]
    if not any(r["RoleName"] == name for r in profile.get("Roles", [])):
        api.call("iam", region, "add_role_to_instance_profile", InstanceProfileName=name, RoleName=name)
    return name


def list_node_roles(api: Ec2Api, region: str, cluster: str | None, owner: str | None) -> list[ClusterResource]:
    """Our roles (path /cloudtrain/) of `cluster` (or every cluster), of `owner` (or anyone's).
    Credentials that may not read IAM (an EC2-only user who never named a bucket) list none, with
    a warning: a role can only exist where such permissions created it."""
    try:
        if cluster is not None:
            try:
                roles = [api.call("iam", region, "get_role", RoleName=role_name(cluster))["Role"]]
            except AwsApiError as exc:
                if exc.code in _GONE:
                    return []
                raise
        else:
            roles = [role for page in api.client("iam", region).get_paginator("list_roles").paginate(
                PathPrefix=ROLE_PATH) for role in page.get("Roles", [])]
        found = []
        for role in roles:
            tags = {t["Key"]: t["Value"] for t in api.call("iam", region, "list_role_tags",
                                                             RoleName=role["RoleName"]).get("Tags", [])}
            if TAG_CLUSTER not in tags or (cluster is not None and tags[TAG_CLUSTER] != cluster):
                continue
            if owner is not None and tags.get(TAG_OWNER) != owner:
                continue
            # IAM costs nothing: `gc` lists the role at $0 (it leaks access, not money).
            found.append(ClusterResource("aws", tags[TAG_CLUSTER], "iam-role", role["RoleName"], None,
                                         hourly_usd=0.0))
        return found
    except AwsApiError as exc:
        if exc.code not in _DENIED:
            raise
        log.warning("aws: IAM roles not checked (%s: %s)", exc.code, exc.aws_message)
        return []


def release_node_role(api: Ec2Api, region: str, cluster: str) -> None:
    """Remove the role, its policy and its instance profile; gone is success."""
    name = role_name(cluster)
    steps: list[tuple[str, dict[str, Any]]] = [
        ("remove_role_from_instance_profile", {"InstanceProfileName": name, "RoleName": name}),
        ("delete_instance_profile", {"InstanceProfileName": name}),
        ("delete_role_policy", {"RoleName": name, "PolicyName": POLICY_NAME}),
        ("delete_role", {"RoleName": name}),
    ]
    for operation, params in steps:
        try:
            api.call("iam", region, operation, **params)
        except AwsApiError as exc:
            if exc.code not in _GONE:
                raise


def describe(cluster: str) -> str:
    return f"the instance's IAM role {role_name(cluster)} (instance profile; no user credentials on the VM)"


def grant_instances(api: Ec2Api, region: str, cluster: str, tags: Mapping[str, str],
                    grants: Sequence[BucketGrant], instances: Mapping[str, tuple[str, dict[str, Any]]]) -> None:
    """A reused cluster's nodes get this recipe's buckets: the role's policy now names exactly
    these (the last recipe's go), and an instance launched without a profile gets one."""
    profile = ensure_node_role(api, region, cluster, tags, grants)
    for instance_id, (where, raw) in sorted(instances.items()):
        if raw.get("IamInstanceProfile") or raw["State"]["Name"] not in ("pending", "running", "stopping", "stopped"):
            continue
        with_new_profile(api, where, profile, "associate_iam_instance_profile", InstanceId=instance_id,
                         IamInstanceProfile={"Name": profile})


def with_new_profile(api: Ec2Api, region: str, profile: str | None, operation: str, **params: Any) -> dict[str, Any]:
    """An EC2 call naming an instance profile, waiting out the profile's propagation. IAM is
    eventually consistent: for several seconds after its creation EC2 refuses a profile with
    InvalidParameterValue ("Invalid IAM Instance Profile name"), having done nothing, so the same
    request (run_instances: the same ClientToken) is repeated with backoff, up to
    PROFILE_PROPAGATION_S, saying what it waits for. The alternative is failing every first
    launch of a cluster with buckets."""
    waited, delay = 0.0, 1.0
    while True:
        try:
            return api.ec2(region, operation, **params)
        except AwsApiError as exc:
            unknown = exc.code == "InvalidParameterValue" and "iaminstanceprofile" in exc.aws_message.lower()
            if profile is None or not unknown or waited >= PROFILE_PROPAGATION_S:
                raise
        log.warning("aws: waiting for the new IAM instance profile %s to reach EC2 (%.0f s so far, up to %d s): "
                    "IAM changes take seconds to propagate", profile, waited, PROFILE_PROPAGATION_S)
        time.sleep(delay)
        waited += delay
        delay = min(delay * 2, 8.0)
