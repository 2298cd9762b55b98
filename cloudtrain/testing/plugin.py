"""pytest plugin (entry point `cloudtrain`): exposes the test kit's fixtures to any project.

Fixture modules are imported here so `pip install cloudtrain[dev]` makes them available without a
conftest. Each module is self-contained and documents its fixtures.
"""

from __future__ import annotations

import importlib
import importlib.util

# Modules contributing fixtures. Listed explicitly so a typo fails loudly once they exist.
_FIXTURE_MODULES = ("cloudtrain.testing.sshd", "cloudtrain.testing.aws")

for _name in _FIXTURE_MODULES:
    if importlib.util.find_spec(_name) is not None:
        _module = importlib.import_module(_name)
        globals().update({k: v for k, v in vars(_module).items() if getattr(v, "_pytestfixturefunction", None) or hasattr(v, "_fixture_function_marker") or type(v).__name__ == "FixtureFunctionDefinition"})
