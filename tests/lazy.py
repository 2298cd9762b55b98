"""Heavy imports for test modules, paid by the test that uses them, not by collection.

Collection imports every test module in every xdist worker: a module-level
`pytest.importorskip("google.cloud.compute_v1")` (3 s), TensorFlow (9 s) or the Azure SDKs (1.6 s)
was paid twice per run, and by `-m quick` runs that never use them. `requires` decides the skip from
the import system's index without executing the package; `Lazy` imports on first attribute use.
"""

from __future__ import annotations

import importlib
import importlib.util
from types import ModuleType

import pytest


def _installed(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except ModuleNotFoundError:  # a parent package is missing
        return False


def requires(*modules: str) -> pytest.MarkDecorator:
    """A skip mark for a test (or `pytestmark = requires(...)` for a module) whose extra is not installed,
    the same decision `pytest.importorskip` makes, without importing the package at collection."""
    missing = [m for m in modules if not _installed(m)]
    return pytest.mark.skipif(bool(missing), reason=f"could not import {', '.join(missing)} (an extra the suite's setup installs)")


class Lazy:
    """A module imported on first attribute access (`compute_v1 = Lazy("google.cloud.compute_v1")`)."""

    def __init__(self, name: str) -> None:
        self._name = name

    def _module(self) -> ModuleType:
        return importlib.import_module(self._name)

    def __getattr__(self, attr: str) -> object:
        # Collection probes every module-level object for private and dunder names (`_mock_name`,
        # `__test__`, ...): answering those would import the module. Tests use public names only.
        if attr.startswith("_"):
            raise AttributeError(attr)
        return getattr(self._module(), attr)
