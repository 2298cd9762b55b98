"""The AWS plumbing under the `aws` provider: session, clients, error mapping, image lookup.

Kept apart from the provider's resource logic (aws.py) so each file reads on its own. Nothing here
is imported on the CLI path until a command uses AWS: boto3 is imported in `Ec2Api.__init__`.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from cloudtrain.errors import CapacityError, CredentialsError, ProviderError, UsageError
from cloudtrain.providers.base import CredentialStatus, InstanceState

log = logging.getLogger("cloudtrain.providers.aws")

SSH_USER = "ubuntu"
DEFAULT_MAX_ATTEMPTS = 5
NO_CREDENTIALS = "no AWS credentials found (run `aws configure` or set AWS_PROFILE)"

EC2_STATES = {
    "pending": InstanceState.PENDING,
    "running": InstanceState.RUNNING,
    "stopping": InstanceState.STOPPING,
    "stopped": InstanceState.STOPPED,
    # Irreversible and no longer billed for compute: as good as gone for the lifecycle.
    "shutting-down": InstanceState.TERMINATED,
    "terminated": InstanceState.TERMINATED,
}
LIVE_STATES = ["pending", "running", "stopping", "stopped"]

# Errors that say "not here, maybe in another zone".
ZONE_CAPACITY_CODES = frozenset(
    {"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity", "Unsupported",
     "SpotMaxPriceTooLow"}
)
# Quotas are per region: another zone would fail the same way, so the region ends there.
REGION_QUOTA_CODES = frozenset({"InstanceLimitExceeded", "VcpuLimitExceeded", "MaxSpotInstanceCountExceeded"})
CAPACITY_CODES = ZONE_CAPACITY_CODES | REGION_QUOTA_CODES
CREDENTIAL_CODES = frozenset(
    {"AuthFailure", "UnauthorizedOperation", "InvalidClientTokenId", "SignatureDoesNotMatch", "ExpiredToken",
     "ExpiredTokenException", "RequestExpired", "UnrecognizedClientException", "InvalidAccessKeyId"}
)

# Public SSM parameters naming the current AMI, and the image-name pattern to search when a region
# or endpoint lacks the parameter. GPU types get the Deep Learning Base AMI (NVIDIA driver
# installed), CPU types plain Ubuntu; both log in as `ubuntu`.
IMAGE_PARAMS = {
    ("gpu", "x86_64"): "/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    ("gpu", "arm64"): "/aws/service/deeplearning/ami/arm64/base-oss-nvidia-driver-gpu-ubuntu-22.04/latest/ami-id",
    ("cpu", "x86_64"): "/aws/service/canonical/ubuntu/server/22.04/stable/current/amd64/hvm/ebs-gp2/ami-id",
    ("cpu", "arm64"): "/aws/service/canonical/ubuntu/server/22.04/stable/current/arm64/hvm/ebs-gp2/ami-id",
}
IMAGE_SEARCH = {
    ("gpu", "x86_64"): ("amazon", "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)*"),
    ("gpu", "arm64"): ("amazon", "Deep Learning ARM64 Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)*"),
    ("cpu", "x86_64"): ("099720109477", "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"),
    ("cpu", "arm64"): ("099720109477", "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-arm64-server-*"),
}
_FAMILY_RE = re.compile(r"^(?P<series>[a-z]+)(?P<gen>\d+)(?P<options>[a-z-]*)\.")


class AwsApiError(ProviderError):
    """An AWS call answered with an error code (other than credentials)."""

    def __init__(self, operation: str, region: str, code: str, aws_message: str) -> None:
        super().__init__(f"AWS {operation} in {region} failed: {code}: {aws_message}")
        self.operation = operation
        self.region = region
        self.code = code
        self.aws_message = aws_message


@dataclass(frozen=True)
class ZoneAttempt:
    zone: str
    code: str
    message: str


class AwsCapacityError(CapacityError):
    """Every zone we were allowed to try in one region refused the launch."""

    def __init__(
        self, region: str, instance_type: str, count: int, attempts: Sequence[ZoneAttempt], why: str = ""
    ) -> None:
        tried = ", ".join(f"{a.zone}: {a.code}" for a in attempts) or why
        super().__init__(
            f"no capacity for {count} x {instance_type} in {region} ({tried})",
            hint="another region, zone or instance type may have capacity; quotas: AWS Service Quotas console",
            scope="region",
        )
        self.region = region
        self.instance_type = instance_type
        self.attempts = tuple(attempts)


@dataclass(frozen=True)
class Image:
    image_id: str
    root_device: str
    root_size_gb: int | None
    ssh_user: str  # the login user the image's cloud-init sets up


# Login users of common public images, by image name; first match wins. Custom images say theirs
# with a `cloudtrain-ssh-user` tag on the AMI.
TAG_SSH_USER = "cloudtrain-ssh-user"
_LOGIN_USERS = (
    ("ubuntu", "ubuntu"),
    ("amzn", "ec2-user"),
    ("al2023", "ec2-user"),
    ("amazon linux", "ec2-user"),
    ("rhel", "ec2-user"),
    ("debian", "admin"),
    ("rocky", "rocky"),
    ("centos", "centos"),
    ("fedora", "fedora"),
)


class Ec2Api:
    """A boto3 session with one client per (service, region), and errors mapped to ours."""

    def __init__(self, region: str | None, profile: str | None, max_attempts: int | None = None) -> None:
        # No SDK here: a provider is made for every verb on an AWS cluster, `exec` and `logs` too,
        # which never call EC2; boto3 is imported by the first session (`_boto3`).
        self.profile = profile
        self.configured_region = region
        self.max_attempts = max_attempts or _env_int("AWS_MAX_ATTEMPTS", DEFAULT_MAX_ATTEMPTS)
        self._session: Any = None
        self._clients: dict[tuple[str, str], Any] = {}
        self._clients_lock = threading.Lock()

    @property
    def _boto3(self) -> Any:
        import boto3

        return boto3

    @property
    def exc(self) -> Any:
        import botocore.exceptions

        return botocore.exceptions

    @property
    def _credential_failures(self) -> tuple[type[Exception], ...]:
        """Credential chain failures (expired SSO token, broken credential_process, partial keys):
        the user must re-authenticate, so they are credentials errors, not provider errors."""
        return (self.exc.NoCredentialsError, self.exc.PartialCredentialsError, self.exc.CredentialRetrievalError,
                self.exc.TokenRetrievalError, self.exc.SSOError, self.exc.NoAuthTokenError)

    def session(self) -> Any:
        if self._session is None:
            try:
                self._session = self._boto3.session.Session(profile_name=self.profile)
            except self.exc.ProfileNotFound as exc:
                raise CredentialsError(f"AWS {exc}", hint="check aws.profile in the config or AWS_PROFILE") from None
        return self._session

    @property
    def default_region(self) -> str | None:
        """The config's region, else the profile's / AWS_DEFAULT_REGION."""
        return self.configured_region or self.session().region_name

    def region(self, wanted: str | None) -> str:
        region = wanted or self.default_region
        if not region:
            raise UsageError(
                "no AWS region: set resources.region in the recipe, aws.region in the config, or AWS_DEFAULT_REGION"
            )
        return region

    def client(self, service: str, region: str) -> Any:
        key = (service, region)
        with self._clients_lock:  # one provider serves the run's threads; a boto3 session is not thread-safe
            return self._client_locked(key, service, region)

    def _client_locked(self, key: tuple[str, str], service: str, region: str) -> Any:
        if key not in self._clients:
            from botocore.config import Config as BotoConfig

            # Adaptive mode: client-side rate limiting once EC2 starts throttling us. total_max_attempts
            # counts the first try, like AWS_MAX_ATTEMPTS (botocore's max_attempts counts retries only).
            config = BotoConfig(
                retries={"mode": "adaptive", "total_max_attempts": self.max_attempts},
                connect_timeout=10,
                read_timeout=60,
                user_agent_extra="cloudtrain",
            )
            self._clients[key] = self.session().client(service, region_name=region, config=config)
        return self._clients[key]

    def call(self, service: str, region: str, operation: str, **params: Any) -> dict[str, Any]:
        """One API call with errors turned into ours: credentials, API error codes, transport."""
        client = self.client(service, region)
        try:
            return getattr(client, operation)(**params)
        except self.exc.NoCredentialsError:
            raise CredentialsError(NO_CREDENTIALS) from None
        except self._credential_failures as exc:
            raise CredentialsError(f"AWS credentials could not be loaded: {exc}", 
                                   hint="log in again (e.g. `aws sso login`), then `cloudtrain check aws`") from None
        except self.exc.ClientError as exc:
            error = exc.response.get("Error", {})
            code, message = str(error.get("Code", "Unknown")), str(error.get("Message", ""))
            if code in CREDENTIAL_CODES:
                raise CredentialsError(
                    f"AWS refused {operation} in {region}: {code}: {message}",
                    hint="check the account, profile and IAM permissions (`cloudtrain check`)",
                ) from None
            raise AwsApiError(operation, region, code, message) from None
        except self.exc.BotoCoreError as exc:
            raise ProviderError(f"AWS {operation} in {region} failed: {exc}") from None

    def ec2(self, region: str, operation: str, **params: Any) -> dict[str, Any]:
        return self.call("ec2", region, operation, **params)

    def pages(self, region: str, operation: str, key: str, **params: Any) -> Iterator[dict[str, Any]]:
        """Items of a paginated EC2 call, following NextToken."""
        while True:
            page = self.ec2(region, operation, **params)
            yield from page.get(key, [])
            token = page.get("NextToken")
            if not token:
                return
            params["NextToken"] = token

    def instances(self, region: str, filters: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return [
            raw
            for reservation in self.pages(region, "describe_instances", "Reservations", Filters=filters)
            for raw in reservation.get("Instances", [])
        ]

    def require_credentials(self) -> None:
        try:
            credentials = self.session().get_credentials()
        except self.exc.BotoCoreError as exc:
            raise CredentialsError(f"AWS credentials could not be loaded: {exc}") from None
        if credentials is None:
            raise CredentialsError(NO_CREDENTIALS)

    def check_credentials(self) -> CredentialStatus:
        try:
            session = self.session()
            credentials = session.get_credentials()
        except CredentialsError as exc:
            return CredentialStatus("aws", False, exc.one_line())
        except self.exc.BotoCoreError as exc:
            return CredentialStatus("aws", False, f"AWS credentials could not be loaded: {exc}")
        if credentials is None:
            return CredentialStatus("aws", False, NO_CREDENTIALS, set_up=False)
        source = _credential_source(session, credentials)
        region = self.default_region
        from botocore.config import Config as BotoConfig

        # A short leash: `check` should answer in seconds even when STS is unreachable.
        sts = session.client(
            "sts",
            region_name=region or "us-east-1",
            config=BotoConfig(
                retries={"mode": "standard", "total_max_attempts": 2}, connect_timeout=5, read_timeout=10
            ),
        )
        try:
            account = sts.get_caller_identity()["Account"]
        except self.exc.ClientError as exc:
            error = exc.response.get("Error", {})
            detail = f"{source}: AWS rejected them ({error.get('Code')}: {error.get('Message')})"
            return CredentialStatus("aws", False, detail)
        except (self.exc.ConnectionError, self.exc.HTTPClientError) as exc:
            return CredentialStatus("aws", False, f"{source}: could not reach AWS STS: {exc}")
        except self.exc.BotoCoreError as exc:
            # e.g. an expired SSO session: the chain found a profile but cannot produce keys.
            return CredentialStatus("aws", False, f"{source}: {exc}")
        where = f"region {region}" if region else "no default region (set aws.region or name one in recipes)"
        return CredentialStatus("aws", True, f"{source}, account {account}, {where}")

    # images ----------------------------------------------------------------------------------

    def resolve_image(self, region: str, image: str | None, instance_type: str, gpu: bool) -> Image:
        """`image`: an AMI id, `resolve:ssm:/param` (EC2's own syntax) or None for our default."""
        if image and image.startswith("ami-"):
            ami = image
        elif image:
            param = image.removeprefix("resolve:ssm:").removeprefix("ssm:")
            if not param.startswith("/"):
                raise UsageError(
                    f"resources.image: expected an AMI id (ami-...) or an SSM parameter (resolve:ssm:/path), "
                    f"got {image!r}"
                )
            found = self._ssm_value(region, param)
            if found is None:
                raise UsageError(f"resources.image: SSM parameter {param} not found in {region}")
            ami = found
        else:
            kind = ("gpu" if gpu else "cpu", instance_arch(instance_type))
            found = self._ssm_value(region, IMAGE_PARAMS[kind]) or self._search_image(region, *IMAGE_SEARCH[kind])
            if found is None:
                raise ProviderError(
                    f"no {kind[0].upper()} {kind[1]} Ubuntu 22.04 image found in {region} "
                    f"(SSM parameter {IMAGE_PARAMS[kind]} missing)",
                    hint="set resources.image to an AMI id",
                )
            ami = found
        try:
            images = self.ec2(region, "describe_images", ImageIds=[ami])["Images"]
        except AwsApiError as exc:
            if not exc.code.startswith("InvalidAMIID"):
                raise
            images = []
        if not images:
            raise UsageError(f"resources.image: AMI {ami} not found in {region}", hint="AMI ids differ between regions")
        found = images[0]
        root = found.get("RootDeviceName") or "/dev/sda1"
        size = next(
            (m.get("Ebs", {}).get("VolumeSize") for m in found.get("BlockDeviceMappings", [])
             if m.get("DeviceName") == root),
            None,
        )
        return Image(ami, root, size, login_user(found))

    def _ssm_value(self, region: str, param: str) -> str | None:
        try:
            return str(self.call("ssm", region, "get_parameter", Name=param)["Parameter"]["Value"])
        except AwsApiError as exc:
            if exc.code in ("ParameterNotFound", "AccessDeniedException"):
                return None
            raise

    def _search_image(self, region: str, owner: str, pattern: str) -> str | None:
        images = self.ec2(
            region, "describe_images", Owners=[owner],
            Filters=[{"Name": "name", "Values": [pattern]}, {"Name": "state", "Values": ["available"]}],
        )["Images"]
        newest = max(images, key=lambda i: i.get("CreationDate", ""), default=None)
        return newest["ImageId"] if newest else None


# helpers -------------------------------------------------------------------------------------


def tag_spec(resource_type: str, tags: dict[str, str]) -> dict[str, Any]:
    return {"ResourceType": resource_type, "Tags": [{"Key": k, "Value": v} for k, v in sorted(tags.items())]}


def tags_of(item: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in item.get("Tags") or []}


def key_body(public_key: str) -> str:
    """'ssh-ed25519 AAAA... comment' -> 'ssh-ed25519 AAAA...' (AWS drops the comment)."""
    return " ".join(public_key.split()[:2])


def login_user(image: dict[str, Any]) -> str:
    tagged = tags_of(image).get(TAG_SSH_USER)
    if tagged:
        return tagged
    name = (image.get("Name") or "").lower()
    return next((user for pattern, user in _LOGIN_USERS if pattern in name), SSH_USER)


def chunks(items: Sequence[str], size: int) -> Iterable[list[str]]:
    for start in range(0, len(items), size):
        yield list(items[start : start + size])


def instance_family(instance_type: str) -> str | None:
    """'g4dn.xlarge' -> 'g' (the series letter(s)), None for names that do not parse."""
    match = _FAMILY_RE.match(instance_type)
    return match.group("series") if match else None


def instance_arch(instance_type: str) -> str:
    """Graviton families carry a 'g' after the generation (m6g, c7gn, t4g, g5g); a1 is arm too."""
    match = _FAMILY_RE.match(instance_type)
    if instance_type.startswith("a1.") or (match and "g" in match.group("options")):
        return "arm64"
    return "x86_64"


def _credential_source(session: Any, credentials: Any) -> str:
    method = getattr(credentials, "method", "") or "unknown"
    readable = {"env": "environment variables", "iam-role": "instance role", "container-role": "container role"}
    if method in readable:
        return f"credentials from {readable[method]}"
    return f"profile {session.profile_name} ({method})"


def _env_int(name: str, default: int) -> int:
    """Honour the AWS CLI's own AWS_MAX_ATTEMPTS, which an explicit botocore Config would override."""
    value = os.environ.get(name, "")
    return int(value) if value.isdigit() and int(value) > 0 else default
