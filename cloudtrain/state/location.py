"""Where the state lives: this machine's SQLite file (the default), or a team's PostgreSQL
database named by `CLOUDTRAIN_STATE_URL` (wins, so CI can point elsewhere) or the config's
`state_url`. Read without pydantic: `status` must stay light, so the config file is parsed only
when it mentions state_url at all."""

from __future__ import annotations

import os
from urllib.parse import parse_qs, urlsplit

from cloudtrain import paths
from cloudtrain.errors import ConfigError

ENV = "CLOUDTRAIN_STATE_URL"
SCHEMES = ("postgresql://", "postgres://")


def is_postgres(location: object) -> bool:
    return isinstance(location, str) and location.startswith(SCHEMES)


def check(url: str, where: str) -> str:
    """A state URL, or one line saying what is wrong with it. A password in it is refused: the URL
    shows in config files, `ps` of a CI job and error messages; libpq's passfile keeps it out."""
    if not is_postgres(url):
        raise ConfigError(f"{where}: state_url {url!r} is not a PostgreSQL URL",
                          hint="expected postgresql://[user@]host[:port]/dbname[?sslmode=...]; "
                               "leave it unset for this machine's own state")
    parts = urlsplit(url)
    if parts.password is not None or "password" in parse_qs(parts.query):
        raise ConfigError(f"{where}: state_url carries a password",
                          hint="drop it from the URL and put it in ~/.pgpass (or PGPASSFILE, or a service "
                               "file: docs/teams.md)")
    return url


PROJECT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,62}$"


def _config(key: str) -> tuple[object, str] | None:
    """The config's top-level `key` and where it was read; the YAML is parsed only when the file
    mentions the key at all (most configs never do)."""
    path = paths.config_file()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    if key not in text:
        return None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        from cloudtrain.yamlfile import read_yaml

        read_yaml(path, ConfigError)  # says where the YAML is broken, as load_config does (config is above state)
        raise
    value = data.get(key) if isinstance(data, dict) else None
    return None if value is None else (value, str(path))


def state_url() -> str | None:
    """The team database's URL, or None for this machine's SQLite file."""
    env = os.environ.get(ENV)
    if env:
        return check(env, f"${ENV}")
    found = _config("state_url")
    if found is None:
        return None
    url, where = found
    if not isinstance(url, str):
        raise ConfigError(f"{where}: state_url: expected a string, got {type(url).__name__}")
    return check(url, where)


def project() -> str:
    """The config's `project:` (what a team database records with every row), else 'default'."""
    import re

    found = _config("project")
    if found is None:
        return "default"
    value, where = found
    if not isinstance(value, str) or not re.match(PROJECT_PATTERN, value):
        raise ConfigError(f"{where}: project: expected lowercase letters, digits, - or _ (at most 63), got {value!r}")
    return value
