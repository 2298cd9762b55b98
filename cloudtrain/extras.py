"""Optional dependencies: which extra provides what, checked before anything runs.

Looked up with importlib.util.find_spec (nothing is imported: TensorFlow alone takes seconds), so a
missing package is one line naming the extra to install, not a ModuleNotFoundError halfway through.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

from cloudtrain.errors import UsageError

# extra -> the modules cloudtrain needs from it (pyproject.toml's [project.optional-dependencies]).
EXTRAS: dict[str, tuple[str, ...]] = {
    "sweep": ("optuna",),
    "tf": ("tensorflow", "numpy"),
    "ssh": ("paramiko",),
}


def missing(modules: Sequence[str]) -> list[str]:
    """The modules of `modules` that this interpreter cannot import."""
    return [m for m in modules if importlib.util.find_spec(m) is None]


def require(extra: str, what: str, modules: Sequence[str] | None = None) -> None:
    """Raise a UsageError (exit 2) naming `extra` when a module it provides (`modules`, default all
    of EXTRAS[extra]) is not installed."""
    absent = missing(EXTRAS[extra] if modules is None else modules)
    if absent:
        raise UsageError(
            f"{what} needs {' and '.join(absent)}, which {'is' if len(absent) == 1 else 'are'} not installed "
            f"in this Python",
            hint=f'install the [{extra}] extra: pip install "cloudtrain[{extra}]" '
                 f'(from a checkout: pip install -e ".[{extra}]")',
        )
