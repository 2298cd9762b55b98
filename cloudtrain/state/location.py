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


def state_url() -> str | None:
    """The team database's URL, or None for this machine's SQLite file."""
    env = os.environ.get(ENV)
    if env:
        return check(env, f"${ENV}")
    path = paths.config_file()
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    if "state_url" not in text:
        return None
    import yaml

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError:
        from cloudtrain.config import load_config

        load_config(path)  # says where the YAML is broken, in the config's own words
        raise
    url = data.get("state_url") if isinstance(data, dict) else None
    if url is None:
        return None
    if not isinstance(url, str):
        raise ConfigError(f"{path}: state_url: expected a string, got {type(url).__name__}")
    return check(url, str(path))
