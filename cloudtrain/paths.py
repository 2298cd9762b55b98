"""Where cloudtrain keeps its files, and where bundled files live in a checkout or a wheel."""

from __future__ import annotations

import os
from pathlib import Path

_PACKAGE_DIR = Path(__file__).resolve().parent


def home_path() -> Path:
    """$CLOUDTRAIN_HOME, else the platform's user data dir; not created (reading must not write)."""
    configured = os.environ.get("CLOUDTRAIN_HOME")
    if configured:
        return Path(configured).expanduser()
    from platformdirs import user_data_dir

    return Path(user_data_dir("cloudtrain", appauthor=False))


def home() -> Path:
    """`home_path()`, created on first use, owner-only (it holds keys, state and config)."""
    path = home_path()
    if not path.is_dir():
        path.mkdir(parents=True, exist_ok=True, mode=0o700)
    return path


def state_db() -> Path:
    return home() / "state.db"


def config_file() -> Path:
    configured = os.environ.get("CLOUDTRAIN_CONFIG")
    # Read only (config is written by its user): finding it must not create the home.
    return Path(configured).expanduser() if configured else home_path() / "config.yaml"


def _bundled_dir(name: str) -> Path:
    # A wheel carries templates/ and recipes/ inside the package; an editable checkout has them
    # next to it. Look in both so the two installs behave the same.
    for candidate in (_PACKAGE_DIR / name, _PACKAGE_DIR.parent / name):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f"bundled {name}/ directory not found next to {_PACKAGE_DIR}")


def templates_dir() -> Path:
    return _bundled_dir("templates")


def recipes_dir() -> Path:
    return _bundled_dir("recipes")


def bundled_jobs_dir() -> Path:
    return _PACKAGE_DIR / "jobs"
