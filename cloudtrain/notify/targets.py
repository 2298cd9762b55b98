"""Where notifications go: the `notify:` list of config.yaml (a person's or team's defaults) and of
a recipe (per run). A target is a signed webhook or a human channel (an Apprise URL), each with the
events it wants (`on:`).

Secrets stay where the user wrote them: `${VAR}` in a URL or secret is read from the environment
when an event is sent (recipes leave `notify:` uninterpolated for that), and state keeps only a
reference to the target (where it is configured and a fingerprint of it), never its URL or secret.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from cloudtrain.notify.model import DEFAULT_ON, EventType

VAR_RE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_PREFIXES = sorted({t.value.split(".")[0] for t in EventType})


class NotifyTarget(BaseModel):
    """One entry of `notify:`: exactly one of `webhook` and `apprise`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    webhook: str | None = Field(default=None, description="an https:// (or http://) URL that receives the signed "
                                "JSON envelope (docs/notifications.md); ${VAR} is read when sending")
    secret: str | None = Field(default=None, description="the webhook's signing secret, whsec_<base64>; write "
                               "${VAR} to keep it out of the file (read when sending, never stored)")
    apprise: str | None = Field(default=None, description="a human channel as an Apprise URL (slack://, msteams://, "
                                "discord://, mailto://, ...); needs the [notify] extra")
    name: str | None = Field(default=None, max_length=60, description="how `cloudtrain events` names this target")
    on: list[str] | None = Field(default=None, description="the events it gets: types (run.failed), groups "
                                 "(run.*) or *; default: everything except run.started")

    @model_validator(mode="before")
    @classmethod
    def _yaml_on(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare `on:` key as the boolean true.
        if isinstance(value, dict) and True in value and "on" not in value:
            value = {("on" if k is True else k): v for k, v in value.items()}
        return value

    @field_validator("webhook")
    @classmethod
    def _webhook(cls, value: str | None) -> str | None:
        if value is not None and not VAR_RE.search(value):
            parts = urlsplit(value)
            if parts.scheme not in ("https", "http") or not parts.hostname:
                raise ValueError(f"expected an http(s):// URL, got {_label_url(value)!r}")
        return value

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: str | None) -> str | None:
        if value is not None and not VAR_RE.fullmatch(value.strip()):
            from cloudtrain.notify.signing import BadSecret, secret_key

            try:
                secret_key(value)
            except BadSecret as exc:
                # Never echo the value: it is a secret, or meant to be one.
                raise ValueError(f"not a signing secret: {exc}") from None
        return value

    @field_validator("apprise")
    @classmethod
    def _apprise(cls, value: str | None) -> str | None:
        if value is not None and "://" not in value and not VAR_RE.search(value):
            raise ValueError("expected an Apprise URL such as slack://..., mailto://... or discord://...")
        return value

    @field_validator("on")
    @classmethod
    def _on(cls, value: list[str] | None) -> list[str] | None:
        for item in value or ():
            if item == "*" or item in EventType._value2member_map_:
                continue
            if item.endswith(".*") and item[:-2] in _PREFIXES:
                continue
            from cloudtrain.yamlfile import did_you_mean

            hint = did_you_mean(item, [t.value for t in EventType] + [f"{p}.*" for p in _PREFIXES])
            raise ValueError(f"unknown event {item!r}" + (f" ({hint})" if hint else "")
                             + f"; events: {', '.join(t.value for t in EventType)}")
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> NotifyTarget:
        if (self.webhook is None) == (self.apprise is None):
            raise ValueError("give either webhook: URL (with secret:) or apprise: URL")
        if self.webhook is not None and not self.secret:
            raise ValueError("webhook needs secret: whsec_... (or ${VAR}): receivers check every delivery with it")
        if self.apprise is not None and self.secret is not None:
            raise ValueError("secret: is for webhook targets; an Apprise URL carries its own credentials")
        if self.apprise is not None and importlib.util.find_spec("apprise") is None:
            raise ValueError('apprise targets need the [notify] extra: pip install "cloudtrain[notify]"')
        return self

    def wants(self, event_type: EventType | str) -> bool:
        kind = str(event_type)
        if self.on is None:
            return kind in {t.value for t in DEFAULT_ON}
        return any(p == "*" or p == kind or (p.endswith(".*") and kind.startswith(p[:-1])) for p in self.on)

    def fingerprint(self) -> str:
        """Who this target is, as state remembers it: a hash of what the user wrote (`${VAR}`
        unexpanded), so a later command finds it again and a changed target is a new one."""
        text = json.dumps([self.webhook, self.secret, self.apprise], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def label(self) -> str:
        """A name safe to print and store: the target's name, else the URL without credentials,
        path or query (Slack's and Discord's webhook URLs are secrets in their path)."""
        if self.name:
            return self.name
        if self.webhook is not None:
            return f"webhook {_label_url(self.webhook)}"
        return f"apprise {(self.apprise or '').split('://', 1)[0]}://…"


def _label_url(url: str) -> str:
    """scheme://host[:port] as written (a ${VAR} there shows as its name), without userinfo, path or query."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url if VAR_RE.fullmatch(url) else "?"
    host = rest.split("/", 1)[0].split("?", 1)[0].rsplit("@", 1)[-1]
    more = "/…" if rest[len(rest.split("/", 1)[0]):].strip("/") else ""
    return f"{scheme}://{host}{more}"


class MissingVariable(LookupError):
    pass


def expand(text: str, env: dict[str, str] | None = None) -> str:
    """`${VAR}` and `${VAR:-default}` from the environment, at send time."""
    env = dict(os.environ) if env is None else env

    def sub(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in env:
            return env[name]
        if default is not None:
            return default
        raise MissingVariable(f"${{{name}}} is not set in this command's environment")

    return VAR_RE.sub(sub, text)


@dataclass(frozen=True)
class TargetRef:
    """Where a target is configured: `config`, or `recipe` with the recipe's path; plus its
    fingerprint. The key of a delivery in state (no secret in it)."""

    src: str
    path: str | None
    fingerprint: str

    def key(self) -> str:
        return f"{self.src}:{self.path or ''}#{self.fingerprint}"

    @classmethod
    def parse(cls, key: str) -> TargetRef:
        head, _, fingerprint = key.rpartition("#")
        src, _, path = head.partition(":")
        return cls(src, path or None, fingerprint)


@dataclass(frozen=True)
class Bound:
    """A target with where it came from."""

    target: NotifyTarget
    ref: TargetRef


def bind(targets: list[NotifyTarget], src: str, path: Path | None = None) -> list[Bound]:
    where = str(path.resolve()) if path is not None else None
    return [Bound(t, TargetRef(src, where, t.fingerprint())) for t in targets]


def resolve(ref: TargetRef) -> NotifyTarget | None:
    """The target a stored reference names, read again from its config or recipe now (None: it is
    no longer there). Only the `notify:` list of a recipe is read, not the whole recipe."""
    from cloudtrain.errors import UsageError

    from cloudtrain import paths

    try:
        candidates = file_targets(paths.config_file() if ref.src == "config" else Path(ref.path or ""))
    except (UsageError, OSError):
        return None
    return next((t for t in candidates if t.fingerprint() == ref.fingerprint), None)


def file_targets(path: Path) -> list[NotifyTarget]:
    """The `notify:` list of a config or recipe file (only that key is read and checked here; the
    command that loads the whole file says what else is wrong with it)."""
    from pydantic import TypeAdapter, ValidationError

    from cloudtrain.errors import RecipeError
    from cloudtrain.yamlfile import read_yaml

    if not path.is_file():
        return []
    data, _, _ = read_yaml(path, RecipeError)
    raw = data.get("notify") if isinstance(data, dict) else None
    if not raw:
        return []
    try:
        return TypeAdapter(list[NotifyTarget]).validate_python(raw)
    except ValidationError:
        return []
