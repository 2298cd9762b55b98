"""User config: $CLOUDTRAIN_HOME/config.yaml (or $CLOUDTRAIN_CONFIG), validated like recipes."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from cloudtrain import paths
from cloudtrain.errors import ConfigError
from cloudtrain.notify.targets import NotifyTarget
from cloudtrain.yamlfile import format_validation_error, read_yaml


class StrictModel(BaseModel):
    """The base of every model read from YAML (config and recipes): unknown keys are errors."""

    model_config = ConfigDict(extra="forbid", frozen=True)


class SshConfig(StrictModel):
    proxy_command: str | None = Field(default=None, description="OpenSSH ProxyCommand; %h and %p are expanded")
    connect_timeout_s: Annotated[float, Field(gt=0)] = 10.0
    connect_retries_s: Annotated[float, Field(ge=0)] = 300.0
    allowed_cidr: str | None = Field(default=None, description="ingress for cloud firewalls; default caller's /32")
    add_include: bool = Field(
        default=True, description="add `Include` of cloudtrain's generated ssh config to ~/.ssh/config"
    )
    persist_s: Annotated[float, Field(ge=0)] = Field(
        default=60.0, description="keep a node's SSH connection open this long after a command (a local "
        "process per node, like OpenSSH's ControlPersist) so the next command skips the handshake; 0: off",
    )


class AwsConfig(StrictModel):
    region: str | None = None
    profile: str | None = None


class GcpConfig(StrictModel):
    project: str | None = None
    region: str | None = None
    api_endpoint: str | None = Field(default=None, description="Compute API endpoint, e.g. https://compute.googleapis.com")
    service_account: Annotated[str, Field(pattern=r"^(default|none|[^@\s]+@[^@\s]+)$")] = Field(
        default="default",
        description="service account every VM runs as, with the compute scope, so that the on-node watchdog "
                    "can delete its own VM (autostop.down): `default` (the project's default compute service "
                    "account), an email, or `none` (no credentials on the VM; autostop.down then refused)",
    )


class AzureConfig(StrictModel):
    subscription_id: str | None = None
    region: str | None = None
    arm_endpoint: str | None = Field(default=None, description="ARM endpoint, e.g. https://management.azure.com")
    authority: str | None = Field(default=None, description="Entra ID authority host, e.g. https://login.microsoftonline.com")


class PolicyConfig(StrictModel):
    """Floors a recipe or `cloudtrain autostop` cannot lift (cloudtrain/policy.py, docs/watchdog.md)."""

    max_idle_minutes: Annotated[int, Field(ge=1)] | None = Field(
        default=None, description="the longest autostop.idle_minutes a recipe may set; a recipe without autostop "
                                  "and `cloudtrain autostop --cancel` are refused")
    max_hours: Annotated[float, Field(gt=0)] | None = Field(
        default=None, description="the largest budget.max_hours a recipe may set; a recipe without one is refused")


# Every cloud takes this as a tag/label value (GCP labels are the strictest: lowercase, <= 63).
OWNER_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"
# Not a valid `owner` (the pattern refuses it): set in code only, by `gc --all-owners`.
ALL_OWNERS = "*"


class Config(StrictModel):
    runs_dir: str = "./runs"
    owner: Annotated[str | None, Field(pattern=OWNER_PATTERN)] = Field(
        default=None,
        description="who launched what, as the `cloudtrain-owner` tag: `gc` lists only this owner's leftovers. Set "
                    "the same value on every machine that launches for you (laptop, CI) to see all of them; "
                    "default: $CLOUDTRAIN_OWNER, else your login name",
    )
    confirm: bool = Field(
        default=True,
        description="ask before run/up/sweep start billing on a priced cloud; false: never ask (CI, the test kit)",
    )
    ssh: SshConfig = Field(default_factory=SshConfig)
    aws: AwsConfig = Field(default_factory=AwsConfig)
    gcp: GcpConfig = Field(default_factory=GcpConfig)
    azure: AzureConfig = Field(default_factory=AzureConfig)
    notify: list[NotifyTarget] = Field(default_factory=list, description="where every run's events go (signed "
                                       "webhooks, Apprise URLs), besides a recipe's own (docs/notifications.md)")
    state_url: str | None = Field(
        default=None,
        description="a team's shared state database, postgresql://[user@]host[:port]/dbname[?sslmode=...] "
                    "(password in ~/.pgpass, never here); $CLOUDTRAIN_STATE_URL wins; unset: this machine's "
                    "SQLite file (docs/teams.md)",
    )

    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="limits that hold over every recipe "
                                 "on a priced cloud (docs/watchdog.md, limits that hold)")
    project: Annotated[str, Field(pattern=OWNER_PATTERN)] = Field(
        default="default", description="with state_url: the project every row you write in the team database is "
                                       "recorded under (docs/teams.md)")

    @field_validator("state_url")
    @classmethod
    def _state_url(cls, value: str | None) -> str | None:
        from cloudtrain.state.location import check

        try:
            return None if value is None else check(value, "state_url")
        except ConfigError as exc:  # pydantic places a ValueError at its line in the file
            raise ValueError(exc.one_line().removeprefix("state_url: ")) from None


def load_config(path: Path | None = None) -> Config:
    path = path or paths.config_file()
    if not path.exists():
        return Config()
    data, node, _ = read_yaml(path, ConfigError)
    if data is None:
        return Config()
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: expected a mapping at the top, got {type(data).__name__}")
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(format_validation_error(path, node, exc, Config)) from None
