"""The `aws` provider: EC2 instances reached over SSH.

What one `launch` creates, all tagged `cloudtrain-cluster` and `cloudtrain-owner`:
- key pair `cloudtrain-<cluster>` imported from the cluster's public key,
- security group `cloudtrain-<cluster>` in the default VPC: TCP 22 from one CIDR only, plus all
  traffic between the cluster's own nodes (multi-node training talks on arbitrary ports),
- instances (and their root volumes) in one zone of one region.

`list_resources` also reports tagged EBS volumes attached to nothing (a volume kept past its
instance is billed by the GB until deleted), and `release_resources` deletes them.

Capacity: a zone out of capacity moves the launch to the region's next zone; a regional quota error
ends the region at once (every zone would say the same). When the region is exhausted we raise
`AwsCapacityError` (a `CapacityError`) listing what was tried; the lifecycle then tries the Plan's
next region. botocore retries throttling (adaptive mode) and 5xx answers; EC2 sends
InsufficientInstanceCapacity as a 500, so each zone gets AWS_MAX_ATTEMPTS tries, which is also what
AWS advises for a momentary shortage. RunInstances carries a ClientToken, so retries never double-launch.

This module never sleeps or polls. Deleting the security group right after terminate fails on real
AWS with DependencyViolation while instances shut down: we report it and leave it, and the next
`terminate` of the cluster (or `release_resources`) deletes it. Leftover groups and key pairs cost nothing.

boto3 is imported in the constructor only: the CLI imports it when a command uses AWS.
"""

from __future__ import annotations

import ipaddress
import re
import uuid
from datetime import datetime, timezone
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cloudtrain.expiry import expiry_of
from cloudtrain.catalog import Catalog, default_catalog
from cloudtrain.config import Config
from cloudtrain.errors import (
    CapacityError,
    CredentialsError,
    NotAvailableError,
    ProviderError,
    UsageError,
)
from cloudtrain.providers.aws.api import (
    CAPACITY_CODES,
    EC2_STATES,
    LIVE_STATES,
    REGION_QUOTA_CODES,
    SSH_USER,
    TAG_SSH_USER,
    AwsApiError,
    AwsCapacityError,
    Ec2Api,
    Image,
    ZoneAttempt,
    chunks,
    instance_family,
    key_body,
    log,
    tag_spec,
    tags_of,
)
from cloudtrain.providers.base import (
    note_launched,
    TAG_CLUSTER,
    TAG_INCARNATION,
    TAG_ALIVE,
    alive_of,
    alive_value,
    TAG_OWNER,
    Traits,
    ClusterResource,
    CredentialStatus,
    Instance,
    InstanceSpec,
    InstanceState,
    listing_owner,
    owner_id,
    sdk_installed,
)

__all__ = ["AwsApiError", "AwsCapacityError", "AwsProvider", "ZoneAttempt", "make_provider"]

# A resource release_resources kept because instances still shutting down hold it: a later
# `down` deletes it. Anything else kept is in use by the cluster's live instances.
_SHUTTING_DOWN = "instances still shutting down"


class AwsProvider:
    name = "aws"
    # IAM is eventually consistent: a role policy or instance profile takes seconds, rarely a minute.
    traits = Traits(remote=True, priced=True, owns_machines=True, cloud_fields=True, grant_propagation_s=60)
    # Stores its instances get an identity for (an IAM role scoped to the recipe's buckets: identity.py).
    bucket_stores = ("s3",)

    @staticmethod
    def image_pins_region(image: str) -> bool:
        """AMI ids exist in one region only (an SSM parameter path resolves in every region)."""
        return image.startswith("ami-")

    def __init__(
        self,
        region: str | None = None,
        profile: str | None = None,
        *,
        regions: Sequence[str] | None = None,
        all_owners: bool = False,
        catalog: Catalog | None = None,
        max_attempts: int | None = None,
    ) -> None:
        """`regions`: where `list_tagged` and id lookups search besides the default region
        (default: the catalog's AWS regions). Listing shows only resources whose owner tag is this
        user's `owner_id()`, so one user's `gc` never touches a colleague's clusters in a shared
        account; `all_owners` lifts that. `max_attempts` (default AWS_MAX_ATTEMPTS or 5) bounds
        botocore's retries of throttling and 5xx answers."""
        self.api = Ec2Api(region, profile, max_attempts)
        self._search_regions = tuple(regions) if regions is not None else None
        self.owner: str | None = None if all_owners else owner_id()
        self.catalog = catalog or default_catalog()
        self._where: dict[str, str] = {}  # instance id -> region, learned from launches and lookups
        self._images: dict[str, str] = {}  # instance id -> its AMI, for an ended one's disk size

    @property
    def default_region(self) -> str | None:
        return self.api.default_region

    def regions(self) -> tuple[str, ...]:
        """Where lookups search, default region first."""
        extra = self._search_regions if self._search_regions is not None else self.catalog.regions("aws")
        return tuple(dict.fromkeys([r for r in (self.api.default_region, *extra) if r]))

    def check_credentials(self) -> CredentialStatus:
        return self.api.check_credentials()

    # launch ----------------------------------------------------------------------------------

    def launch(self, spec: InstanceSpec, count: int) -> list[Instance]:
        if count < 1:
            raise UsageError(f"cannot launch {count} instances")
        if not spec.instance_type:
            raise UsageError(
                "resources.instance_type: AWS needs an instance type", hint="set instance_type or accelerators"
            )
        if not spec.ssh_public_key:
            raise UsageError(f"cluster {spec.cluster}: no SSH public key to install on AWS instances")
        self.api.require_credentials()
        region = self.api.region(spec.region)
        cidr = _ingress_cidr(spec.allowed_cidr)
        image = self.api.resolve_image(region, spec.image, spec.instance_type, self._is_gpu(spec))
        zones = [spec.zone] if spec.zone else [z for z in self._zones_offering(region, spec.instance_type)
                                               if z not in spec.avoid_zones]
        try:
            key_name = self._ensure_key_pair(region, spec)
            group_id = self._ensure_security_group(region, spec, cidr)
            profile = self._ensure_node_role(region, spec)
            instances = self._run_in_zones(region, zones, spec, count, image, key_name, group_id, profile)
        except BaseException:
            # Nothing half-created: no instance exists here (RunInstances is all-or-nothing and
            # _run_in_zones cleans up after itself), so drop the key pair and group unless in use.
            self._release_quietly(region, spec.cluster)
            if spec.buckets:
                self._release_role_quietly(spec.cluster)
            raise
        for instance in instances:
            self._where[instance.id] = region
        return instances

    def _run_in_zones(
        self,
        region: str,
        zones: Sequence[str],
        spec: InstanceSpec,
        count: int,
        image: Image,
        key_name: str,
        group_id: str,
        profile: str | None = None,
    ) -> list[Instance]:
        assert spec.instance_type is not None
        attempts: list[ZoneAttempt] = []
        for zone in zones:
            token = uuid.uuid4().hex
            params = self._run_params(spec, count, image, key_name, group_id, zone, token)
            if profile is not None:
                params["IamInstanceProfile"] = {"Name": profile}
            try:
                from cloudtrain.providers.aws.identity import with_new_profile

                response = with_new_profile(self.api, region, profile, "run_instances", **params)
            except AwsApiError as exc:
                if exc.code not in CAPACITY_CODES:
                    raise
                attempts.append(ZoneAttempt(zone, exc.code, exc.aws_message))
                log.info("aws: %s in %s: %s; %s", spec.instance_type, zone, exc.code, exc.aws_message)
                if exc.code in REGION_QUOTA_CODES:
                    break
                continue
            except BaseException as exc:
                # Interrupted or timed out mid-call: the launch may have happened without us
                # seeing its answer. The ClientToken identifies it; end it before re-raising, and
                # name it on the way out so that the ledger bills its seconds.
                note_launched(exc, self._terminate_token_quietly(region, spec.cluster, token))
                raise
            return [self._instance(raw, region) for raw in response["Instances"]]
        raise AwsCapacityError(region, spec.instance_type, count, attempts, why="no zone to try")

    def _run_params(
        self, spec: InstanceSpec, count: int, image: Image, key_name: str, group_id: str, zone: str, token: str
    ) -> dict[str, Any]:
        tags = spec.all_tags()
        user = spec.ssh_user or image.ssh_user
        if user != SSH_USER:
            # Remembered on the instance, so `describe` in a later process names the right user.
            tags[TAG_SSH_USER] = user
        shutdown = spec.shutdown_behavior
        if spec.spot and shutdown == "stop":
            # One-time spot instances cannot be stopped, by the API or from inside the VM.
            log.info("aws: spot instances terminate on shutdown (one-time spot requests cannot stop)")
            shutdown = "terminate"
        params: dict[str, Any] = {
            "ImageId": image.image_id,
            "InstanceType": spec.instance_type,
            "MinCount": count,  # all nodes or none: a half cluster cannot train
            "MaxCount": count,
            "KeyName": key_name,
            "SecurityGroupIds": [group_id],
            "Placement": {"AvailabilityZone": zone},
            "InstanceInitiatedShutdownBehavior": shutdown,
            "ClientToken": token,
            "MetadataOptions": {"HttpTokens": "required", "HttpEndpoint": "enabled"},
            "TagSpecifications": [tag_spec("instance", tags), tag_spec("volume", spec.all_tags())],
        }
        if spec.disk_gb is not None:
            size = spec.disk_gb
            if image.root_size_gb and size < image.root_size_gb:
                # A root volume smaller than the image's snapshot is an API error; a few GB more is not.
                log.warning("aws: disk_gb %s is below the image's %s GB root snapshot; using %s GB",
                            size, image.root_size_gb, image.root_size_gb)
                size = image.root_size_gb
            ebs = {"VolumeSize": size, "VolumeType": "gp3", "DeleteOnTermination": True}
            params["BlockDeviceMappings"] = [{"DeviceName": image.root_device, "Ebs": ebs}]
        if spec.max_run_s is not None:
            # The deadline travels in the launch request (cloud-init runs it at first boot), so a
            # VM whose CLI died during boot still ends on time; its shutdown behaviour decides
            # stop or delete.
            from cloudtrain.providers.deadline import shutdown_script

            params["UserData"] = shutdown_script(spec.max_run_s)
        if spec.spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        return params

    def _ensure_node_role(self, region: str, spec: InstanceSpec) -> str | None:
        """The cluster's IAM role and instance profile, allowed exactly the recipe's buckets."""
        if not spec.buckets:
            return None
        from cloudtrain.providers.aws.identity import ensure_node_role

        return ensure_node_role(self.api, region, spec.cluster, spec.all_tags(), spec.buckets)

    def _release_role_quietly(self, cluster: str) -> None:
        from cloudtrain.providers.aws.identity import release_node_role

        try:
            release_node_role(self.api, self._iam_region(), cluster)
        except (ProviderError, CredentialsError) as exc:
            log.warning("aws: could not remove the IAM role of cluster %s: %s", cluster, exc.one_line())

    def _iam_region(self) -> str:
        return self.api.default_region or "us-east-1"  # IAM is global; any region's endpoint answers

    def grant_buckets(self, cluster: str, instance_ids: Sequence[str], grants: Sequence[Any]) -> None:
        """A reused cluster's nodes may reach exactly this recipe's buckets (identity.grant_instances)."""
        from cloudtrain.providers.aws.identity import grant_instances

        tags = {TAG_CLUSTER: cluster, TAG_OWNER: self.owner or owner_id()}
        grant_instances(self.api, self._iam_region(), cluster, tags, grants, self._lookup(instance_ids))

    def bucket_identity(self, cluster: str) -> str:
        """What the nodes read and write buckets with, in words (cloudtrain/buckets/steps.py)."""
        from cloudtrain.providers.aws.identity import describe

        return describe(cluster)

    def _zones_offering(self, region: str, instance_type: str) -> list[str]:
        available = [{"Name": "state", "Values": ["available"]}, {"Name": "zone-type", "Values": ["availability-zone"]}]
        listed = self.api.ec2(region, "describe_availability_zones", Filters=available)["AvailabilityZones"]
        zones = sorted(z["ZoneName"] for z in listed)
        try:
            offered = {
                o["Location"]
                for o in self.api.pages(
                    region, "describe_instance_type_offerings", "InstanceTypeOfferings",
                    LocationType="availability-zone", Filters=[{"Name": "instance-type", "Values": [instance_type]}],
                )
            }
        except AwsApiError as exc:
            # Only an optimisation (skip zones that would answer Unsupported): try them all instead.
            log.info("aws: instance type offerings unavailable in %s (%s); trying every zone", region, exc.code)
            return zones
        usable = [z for z in zones if z in offered]
        if not usable:
            raise AwsCapacityError(region, instance_type, 1, (), why=f"{instance_type} is not offered in any zone")
        return usable

    # key pair and security group -------------------------------------------------------------

    def _ensure_key_pair(self, region: str, spec: InstanceSpec) -> str:
        assert spec.ssh_public_key is not None
        name = f"cloudtrain-{spec.cluster}"
        material = spec.ssh_public_key.strip().encode()
        try:
            self._import_key(region, name, material, spec)
            return name
        except AwsApiError as exc:
            if exc.code != "InvalidKeyPair.Duplicate":
                raise
        existing = self.api.ec2(region, "describe_key_pairs", KeyNames=[name], IncludePublicKey=True)["KeyPairs"][0]
        if tags_of(existing).get(TAG_CLUSTER) != spec.cluster:
            raise ProviderError(
                f"key pair {name} in {region} exists and is not cloudtrain's for cluster {spec.cluster}",
                hint="delete it or use another cluster name",
            )
        if key_body(existing.get("PublicKey", "")) == key_body(spec.ssh_public_key):
            return name
        # Same cluster name, new local key (state was lost): replace it unless instances rely on it.
        if self._in_use(region, "key-name", name):
            raise ProviderError(f"key pair {name} in {region} holds another public key and instances still use it",
                                hint=f"`cloudtrain down {spec.cluster}` first")
        self.api.ec2(region, "delete_key_pair", KeyName=name)
        self._import_key(region, name, material, spec)
        return name

    def _import_key(self, region: str, name: str, material: bytes, spec: InstanceSpec) -> None:
        self.api.ec2(region, "import_key_pair", KeyName=name, PublicKeyMaterial=material,
                     TagSpecifications=[tag_spec("key-pair", spec.all_tags())])

    def _ensure_security_group(self, region: str, spec: InstanceSpec, cidr: str) -> str:
        name = f"cloudtrain-{spec.cluster}"
        vpcs = self.api.ec2(region, "describe_vpcs", Filters=[{"Name": "isDefault", "Values": ["true"]}])["Vpcs"]
        if not vpcs:
            raise ProviderError(
                f"no default VPC in {region}", hint=f"create one: aws ec2 create-default-vpc --region {region}"
            )
        vpc_id = vpcs[0]["VpcId"]
        by_name = [{"Name": "group-name", "Values": [name]}, {"Name": "vpc-id", "Values": [vpc_id]}]
        found = self.api.ec2(region, "describe_security_groups", Filters=by_name)["SecurityGroups"]
        if found:
            group = found[0]
            if tags_of(group).get(TAG_CLUSTER) != spec.cluster:
                raise ProviderError(
                    f"security group {name} in {region} exists and is not cloudtrain's for cluster {spec.cluster}",
                    hint="delete it or use another cluster name",
                )
        else:
            created = self.api.ec2(
                region, "create_security_group", GroupName=name, VpcId=vpc_id,
                Description=f"cloudtrain cluster {spec.cluster}: SSH from one address, nodes to each other",
                TagSpecifications=[tag_spec("security-group", spec.all_tags())],
            )
            group = {"GroupId": created["GroupId"], "IpPermissions": []}
        group_id = group["GroupId"]
        ssh_cidrs = [
            r["CidrIp"]
            for p in group.get("IpPermissions", [])
            if p.get("IpProtocol") == "tcp" and p.get("FromPort") == 22 and p.get("ToPort") == 22
            for r in p.get("IpRanges", [])
        ]
        self_rule = any(
            p.get("IpProtocol") == "-1" and any(g.get("GroupId") == group_id for g in p.get("UserIdGroupPairs", []))
            for p in group.get("IpPermissions", [])
        )
        wanted: list[dict[str, Any]] = []
        if cidr not in ssh_cidrs:
            wanted.append({"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22,
                           "IpRanges": [{"CidrIp": cidr, "Description": "cloudtrain ssh"}]})
        if not self_rule:
            wanted.append({"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group_id}]})
        if wanted:
            self.api.ec2(region, "authorize_security_group_ingress", GroupId=group_id, IpPermissions=wanted)
        stale = [c for c in ssh_cidrs if c != cidr]
        if stale:
            # The caller's address changed since the group was made: SSH stays open to one address.
            revoke = {"IpProtocol": "tcp", "FromPort": 22, "ToPort": 22, "IpRanges": [{"CidrIp": c} for c in stale]}
            self.api.ec2(region, "revoke_security_group_ingress", GroupId=group_id, IpPermissions=[revoke])
        return group_id

    def _in_use(self, region: str, filter_name: str, value: str) -> bool:
        live = {"Name": "instance-state-name", "Values": LIVE_STATES}
        return bool(self.api.instances(region, [{"Name": filter_name, "Values": [value]}, live]))

    def release_resources(self, cluster: str) -> list[ClusterResource]:
        """Delete the cluster's key pair and security group wherever no live instance uses them.

        Returns what had to stay: in use by live instances, or a group still attached to instances
        shutting down, which a later call deletes. `terminate` releases every cluster it touches;
        `gc` releases the clusters `list_resources()` finds that state no longer knows.
        """
        left: list[ClusterResource] = []
        for region in self.regions():
            left.extend(self._release(region, cluster))
        self._release_role(cluster, left)
        return left

    def _release_role(self, cluster: str, left: list[ClusterResource]) -> None:
        """The cluster's IAM role goes once no instance of the cluster is left to use it."""
        from cloudtrain.providers.aws.identity import list_node_roles, release_node_role

        roles = list_node_roles(self.api, self._iam_region(), cluster, self.owner)
        if not roles:
            return
        if self.list_tagged(cluster):
            left.extend(ClusterResource("aws", cluster, r.kind, r.id, None, "in use") for r in roles)
            return
        release_node_role(self.api, self._iam_region(), cluster)

    def _release(self, region: str, cluster: str) -> list[ClusterResource]:
        name = f"cloudtrain-{cluster}"
        mine = [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
        left: list[ClusterResource] = []
        keys = self.api.ec2(region, "describe_key_pairs", Filters=[{"Name": "key-name", "Values": [name]}, *mine])
        if keys["KeyPairs"]:
            if self._in_use(region, "key-name", name):
                left.append(ClusterResource("aws", cluster, "key-pair", name, region, "in use"))
            else:
                self.api.ec2(region, "delete_key_pair", KeyName=name)
        by_name = [{"Name": "group-name", "Values": [name]}, *mine]
        groups = self.api.ec2(region, "describe_security_groups", Filters=by_name)["SecurityGroups"]
        for group in groups:
            group_id = group["GroupId"]
            if self._in_use(region, "instance.group-id", group_id):
                left.append(ClusterResource("aws", cluster, "security-group", group_id, region, "in use"))
                continue
            try:
                self.api.ec2(region, "delete_security_group", GroupId=group_id)
            except AwsApiError as exc:
                if exc.code == "DependencyViolation":
                    left.append(ClusterResource("aws", cluster, "security-group", group_id, region, _SHUTTING_DOWN))
                elif exc.code != "InvalidGroup.NotFound":
                    raise
        owned = [*mine, *([{"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]}] if self.owner else [])]
        for volume in self._loose_volumes(region, owned):
            try:
                self.api.ec2(region, "delete_volume", VolumeId=volume["VolumeId"])
            except AwsApiError as exc:
                # Attached again since we listed it (someone reused it): it is in use, keep it.
                if exc.code == "VolumeInUse":
                    left.append(ClusterResource("aws", cluster, "volume", volume["VolumeId"], region, "in use",
                                                size_gb=float(volume.get("Size", 0))))
                elif exc.code != "InvalidVolume.NotFound":
                    raise
        return left

    def _release_quietly(self, region: str, cluster: str) -> None:
        """Cleanup on a failure path must not hide the failure it is cleaning up after."""
        try:
            left = self._release(region, cluster)
        except (ProviderError, CredentialsError) as exc:
            log.warning("aws: could not clean up cluster %s in %s: %s", cluster, region, exc.one_line())
            return
        _log_leftovers(cluster, left)

    def _terminate_token_quietly(self, region: str, cluster: str, token: str) -> list[Instance]:
        """Terminate what the launch with `token` made; returns those instances as last seen."""
        try:
            live = {"Name": "instance-state-name", "Values": LIVE_STATES}
            raws = self.api.instances(region, [{"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}, live])
            made = [self._instance(r, region) for r in raws if r.get("ClientToken") == token]
            if made:
                self.api.ec2(region, "terminate_instances", InstanceIds=[i.id for i in made])
                for instance in made:
                    self._where[instance.id] = region
            return made
        except (ProviderError, CredentialsError) as exc:
            log.warning("aws: could not check for instances of interrupted launch %s: %s", token, exc.one_line())
            return []

    def _is_gpu(self, spec: InstanceSpec) -> bool:
        """GPU types get the Deep Learning AMI (driver installed); the catalog knows, else the name."""
        assert spec.instance_type is not None
        offer = self.catalog.describe_type("aws", spec.instance_type)
        if offer is not None:
            return offer.accelerator_count > 0
        return bool(spec.accelerators) or instance_family(spec.instance_type) in ("g", "p")

    # describe, list, stop, start, terminate --------------------------------------------------

    def describe(self, ids: Sequence[str]) -> list[Instance]:
        found = self._lookup(ids)
        gone = InstanceState.TERMINATED
        return [self._instance(found[i][1], found[i][0]) if i in found else Instance(i, "", gone) for i in ids]

    def list_tagged(self, cluster: str | None = None) -> list[Instance]:
        return self._list(cluster, LIVE_STATES)

    def list_ended(self, cluster: str) -> list[Instance]:
        ended = self._list(cluster, ["shutting-down", "terminated"], sized=False)
        return [replace(i, disk_gb=self._image_gb(i)) if i.disk_gb is None else i for i in ended]

    def _image_gb(self, instance: Instance) -> float | None:
        """An ended instance's volumes are gone with it: its disks were its image's root snapshot
        size (a recipe's larger disk_gb is not in EC2's answer; the ledger then bills the image's)."""
        region = self._where.get(instance.id)
        image = self._images.get(instance.id)
        if region is None or image is None:
            return None
        try:
            found = self.api.ec2(region, "describe_images", ImageIds=[image])["Images"]
        except AwsApiError as exc:
            log.debug("aws: image %s of ended %s: %s", image, instance.id, exc)
            return None
        sizes = [m["Ebs"]["VolumeSize"] for f in found for m in f.get("BlockDeviceMappings", [])
                 if m.get("Ebs", {}).get("VolumeSize")]
        return float(sum(sizes)) if sizes else None

    def _list(self, cluster: str | None, states: Sequence[str], sized: bool = True) -> list[Instance]:
        if cluster:
            tagged = {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}
        else:
            tagged = {"Name": "tag-key", "Values": [TAG_CLUSTER]}
        filters = [tagged, {"Name": "instance-state-name", "Values": list(states)}]
        if self.owner:
            filters.append({"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]})
        found = []
        for region in self.regions():
            raws = self.api.instances(region, filters)
            sizes = self._disk_sizes(region, [r["InstanceId"] for r in raws]) if raws and sized else {}
            for raw in raws:
                self._where[raw["InstanceId"]] = region
                if raw.get("ImageId"):
                    self._images[raw["InstanceId"]] = raw["ImageId"]
                found.append(self._instance(raw, region, sizes.get(raw["InstanceId"])))
        return found

    def _disk_sizes(self, region: str, ids: Sequence[str]) -> dict[str, float]:
        """Total GB of the EBS volumes attached to each instance: what a stopped one still costs."""
        sizes: dict[str, float] = {}
        for chunk in chunks(list(ids), 200):
            attached = [{"Name": "attachment.instance-id", "Values": chunk}]
            for volume in self.api.pages(region, "describe_volumes", "Volumes", Filters=attached):
                for attachment in volume.get("Attachments", []):
                    instance_id = attachment.get("InstanceId")
                    if instance_id:
                        sizes[instance_id] = sizes.get(instance_id, 0.0) + float(volume.get("Size", 0))
        return sizes

    def list_resources(self, cluster: str | None = None) -> list[ClusterResource]:
        """This owner's cloudtrain key pairs, security groups and unattached volumes (of one
        cluster, or all). Volumes attached to an instance go with it and are not listed."""
        tag_filters = [{"Name": "tag-key", "Values": [TAG_CLUSTER]} if cluster is None
                       else {"Name": f"tag:{TAG_CLUSTER}", "Values": [cluster]}]
        if self.owner:
            tag_filters.append({"Name": f"tag:{TAG_OWNER}", "Values": [self.owner]})
        found: list[ClusterResource] = []
        for region in self.regions():
            for item in self.api.ec2(region, "describe_key_pairs", Filters=tag_filters)["KeyPairs"]:
                found.append(ClusterResource("aws", tags_of(item)[TAG_CLUSTER], "key-pair", item["KeyName"], region))
            for item in self.api.ec2(region, "describe_security_groups", Filters=tag_filters)["SecurityGroups"]:
                found.append(ClusterResource("aws", tags_of(item)[TAG_CLUSTER], "security-group", item["GroupId"],
                                             region))
            for item in self._loose_volumes(region, tag_filters):
                found.append(ClusterResource("aws", tags_of(item)[TAG_CLUSTER], "volume", item["VolumeId"], region,
                                             size_gb=float(item.get("Size", 0))))
        from cloudtrain.providers.aws.identity import list_node_roles

        found.extend(list_node_roles(self.api, self._iam_region(), cluster, self.owner))
        return found

    def _loose_volumes(self, region: str, tag_filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Tagged volumes attached to no instance ("available"): billed, and nothing deletes them."""
        loose = [*tag_filters, {"Name": "status", "Values": ["available"]}]
        return list(self.api.pages(region, "describe_volumes", "Volumes", Filters=loose))

    def mark_alive(self, ids: Sequence[str], at: float) -> None:
        found = self._lookup(ids)
        by_region: dict[str, list[str]] = {}
        for instance_id, (region, raw) in found.items():
            if raw["State"]["Name"] not in ("shutting-down", "terminated"):
                by_region.setdefault(region, []).append(instance_id)
        for region, live in by_region.items():
            for chunk in chunks(live, 500):
                self.api.ec2(region, "create_tags", Resources=chunk,
                             Tags=[{"Key": TAG_ALIVE, "Value": alive_value(at)}])

    def stop(self, ids: Sequence[str]) -> None:
        for region, raws in self._by_region(ids, "stop").items():
            spot = [r["InstanceId"] for r in raws if r.get("InstanceLifecycle") == "spot"]
            if spot:
                raise ProviderError(
                    f"cannot stop spot instance(s) {', '.join(spot)}: one-time spot instances only terminate",
                    hint="use `cloudtrain down`",
                )
            todo = [r["InstanceId"] for r in raws if r["State"]["Name"] not in ("stopping", "stopped")]
            if todo:
                self.api.ec2(region, "stop_instances", InstanceIds=todo)

    def start(self, ids: Sequence[str]) -> None:
        for region, raws in self._by_region(ids, "start").items():
            todo = [r["InstanceId"] for r in raws if r["State"]["Name"] not in ("pending", "running")]
            if not todo:
                continue
            try:
                self.api.ec2(region, "start_instances", InstanceIds=todo)
            except AwsApiError as exc:
                if exc.code in CAPACITY_CODES:
                    # A stopped instance is pinned to its zone: nothing to fail over to.
                    raise CapacityError(
                        f"no capacity to start {', '.join(todo)} in {region}: {exc.code}",
                        hint="try again later, or `cloudtrain down` and launch elsewhere",
                    ) from None
                raise

    def terminate(self, ids: Sequence[str]) -> None:
        """Idempotent: unknown and terminated ids are success. Then release the clusters' key
        pairs and security groups once nothing live uses them (see `release`)."""
        found = self._lookup(ids)
        by_region: dict[str, list[str]] = {}
        clusters: set[tuple[str, str]] = set()
        for instance_id, (region, raw) in found.items():
            if raw["State"]["Name"] not in ("shutting-down", "terminated"):
                by_region.setdefault(region, []).append(instance_id)
            cluster = tags_of(raw).get(TAG_CLUSTER)
            if cluster:
                clusters.add((region, cluster))
        for region, live in by_region.items():
            for chunk in chunks(live, 500):
                try:
                    self.api.ec2(region, "terminate_instances", InstanceIds=chunk)
                except AwsApiError as exc:
                    if exc.code != "InvalidInstanceID.NotFound":
                        raise
                    # Gone between our lookup and the call: one by one, gone counts as done.
                    for instance_id in chunk:
                        self._terminate_one(region, instance_id)
        for region, cluster in sorted(clusters):
            left = self._release(region, cluster)
            self._release_role(cluster, left)
            _log_leftovers(cluster, left)

    def watchdog_action(self, instance: Instance, down: bool) -> dict[str, Any]:
        """An OS shutdown, which EC2 turns into a stop or a terminate by the instance's
        InstanceInitiatedShutdownBehavior (set at launch from autostop.down, changed here when a
        live `cloudtrain autostop --down` asks otherwise). One-time spot instances cannot stop:
        their shutdown terminates, whatever is asked. No credentials on the VM."""
        found = self._lookup([instance.id])
        if instance.id not in found or found[instance.id][1]["State"]["Name"] in ("shutting-down", "terminated"):
            raise ProviderError(f"no live instance {instance.id} in {', '.join(self.regions())}",
                                hint="`cloudtrain status --refresh` shows what exists")
        region, raw = found[instance.id]
        spot = raw.get("InstanceLifecycle") == "spot"
        wanted = "terminate" if down or spot else "stop"
        attribute = "instanceInitiatedShutdownBehavior"
        current = self.api.ec2(region, "describe_instance_attribute", InstanceId=instance.id, Attribute=attribute)
        if current.get("InstanceInitiatedShutdownBehavior", {}).get("Value") != wanted:
            # The Attribute/Value form: EC2 and moto both take it.
            self.api.ec2(region, "modify_instance_attribute", InstanceId=instance.id, Attribute=attribute,
                         Value=wanted)
        action: dict[str, Any] = {"kind": "shutdown", "effect": "delete" if wanted == "terminate" else "stop",
                                  "identity": _imds_identity(instance.id)}
        if spot and not down:
            action["note"] = "spot instance: a shutdown terminates it (one-time spot requests cannot stop)"
        return action

    def _terminate_one(self, region: str, instance_id: str) -> None:
        try:
            self.api.ec2(region, "terminate_instances", InstanceIds=[instance_id])
        except AwsApiError as exc:
            if exc.code != "InvalidInstanceID.NotFound":
                raise

    def _by_region(self, ids: Sequence[str], verb: str) -> dict[str, list[dict[str, Any]]]:
        found = self._lookup(ids)
        gone = [i for i in ids if i not in found or found[i][1]["State"]["Name"] in ("shutting-down", "terminated")]
        if gone:
            raise ProviderError(
                f"cannot {verb} {', '.join(gone)}: no such live instance in {', '.join(self.regions())}",
                hint="`cloudtrain status --refresh` shows what exists",
            )
        grouped: dict[str, list[dict[str, Any]]] = {}
        for region, raw in found.values():
            grouped.setdefault(region, []).append(raw)
        return grouped

    def _lookup(self, ids: Sequence[str]) -> dict[str, tuple[str, dict[str, Any]]]:
        """Find instances by id across regions (ids do not name their region): regions where we
        saw them first, then the default region, then the rest. Missing ids are simply absent."""
        remaining = list(dict.fromkeys(ids))
        found: dict[str, tuple[str, dict[str, Any]]] = {}
        order = list(dict.fromkeys([*(self._where[i] for i in remaining if i in self._where), *self.regions()]))
        for region in order:
            if not remaining:
                break
            for chunk in chunks(remaining, 200):
                for raw in self.api.instances(region, [{"Name": "instance-id", "Values": chunk}]):
                    found[raw["InstanceId"]] = (region, raw)
                    self._where[raw["InstanceId"]] = region
            remaining = [i for i in remaining if i not in found]
        return found

    def _instance(self, raw: dict[str, Any], region: str, disk_gb: float | None = None) -> Instance:
        tags = tags_of(raw)
        instance_type = raw.get("InstanceType")
        zone = raw.get("Placement", {}).get("AvailabilityZone")
        launched = raw.get("LaunchTime")
        name = raw.get("State", {}).get("Name", "")
        return Instance(
            id=raw["InstanceId"],
            cluster=tags.get(TAG_CLUSTER, ""),
            incarnation=tags.get(TAG_INCARNATION),
            alive_at=alive_of(tags),
            expiry=expiry_of(tags),
            state=EC2_STATES.get(raw.get("State", {}).get("Name", ""), InstanceState.UNKNOWN),
            instance_type=instance_type,
            region=region,
            zone=zone,
            public_ip=raw.get("PublicIpAddress"),
            private_ip=raw.get("PrivateIpAddress"),
            ssh_user=tags.get(TAG_SSH_USER, SSH_USER),
            launched_at=launched.timestamp() if launched is not None else None,
            spot=raw.get("InstanceLifecycle") == "spot",
            disk_gb=disk_gb,
            state_since=_state_since(name, raw, launched),
            # EC2 bills no compute while an instance is stopping (hibernation aside).
            compute_billed=False if name == "stopping" else None,
        )


# helpers -------------------------------------------------------------------------------------


_REASON_TIME = re.compile(r"\((\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}) (?:GMT|UTC)\)")


def _state_since(state: str, raw: dict[str, Any], launched: Any) -> float | None:
    """When the instance entered its state, by EC2's clock: the launch time for a running one (EC2
    sets LaunchTime again at every start), the time in StateTransitionReason ("User initiated
    (2026-11-25 12:00:00 GMT)") for a stop or termination, whoever asked for it."""
    if state in ("pending", "running"):
        return launched.timestamp() if launched is not None else None
    found = _REASON_TIME.search(raw.get("StateTransitionReason") or "")
    if found is None:
        return None
    return datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(tzinfo=timezone.utc).timestamp()



def _log_leftovers(cluster: str, left: Sequence[ClusterResource]) -> None:
    later = [f"{r.kind} {r.id} in {r.region} ({r.note})" for r in left if r.note == _SHUTTING_DOWN]
    if later:
        log.warning("aws: kept for a later `cloudtrain down %s`: %s", cluster, "; ".join(later))
    kept = [f"{r.kind} {r.id} in {r.region} ({r.note})" for r in left if r.note != _SHUTTING_DOWN]
    if kept:
        log.info("aws: kept for the cluster's other instances: %s", "; ".join(kept))


def _ingress_cidr(cidr: str | None) -> str:
    if not cidr:
        raise UsageError(
            "ssh.allowed_cidr is not set: no address to allow SSH from",
            hint="set ssh.allowed_cidr in the config, e.g. 203.0.113.7/32",
        )
    try:
        network = ipaddress.ip_network(cidr, strict=False)
    except ValueError:
        raise UsageError(f"ssh.allowed_cidr: {cidr!r} is not a CIDR like 203.0.113.7/32") from None
    if network.version != 4:
        raise NotAvailableError(
            f"ssh.allowed_cidr: IPv6 ({cidr}) is not supported on AWS yet", hint="give an IPv4 /32"
        )
    if network.prefixlen == 0:
        log.warning("aws: SSH is open to the whole internet (allowed_cidr %s); prefer your address/32", cidr)
    return str(network)


def _imds_identity(instance_id: str) -> dict[str, Any]:
    """How the on-node watchdog asks this is `instance_id` before an OS power-off (cloudtrain/
    node/actions.py is_the_node): IMDSv2, a session token then the instance id, reachable only on the VM."""
    return {"token": {"url": "http://169.254.169.254/latest/api/token", "method": "PUT",
                      "headers": {"X-aws-ec2-metadata-token-ttl-seconds": "60"}, "header": "X-aws-ec2-metadata-token"},
            "url": "http://169.254.169.254/latest/meta-data/instance-id", "expect": instance_id}


def make_provider(config: Config) -> AwsProvider:
    # boto3 is imported on first use (api.Ec2Api); whether it is there is asked now.
    if not sdk_installed("boto3", "botocore"):
        raise NotAvailableError("cloud aws needs boto3", hint="pip install 'cloudtrain[aws]'")
    return AwsProvider(region=config.aws.region, profile=config.aws.profile,
                       all_owners=listing_owner(config) is None)  # gc --all-owners
