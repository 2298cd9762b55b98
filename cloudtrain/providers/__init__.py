"""Provider registry. Modules are imported only when a cloud is used, so the CLI stays fast."""

from __future__ import annotations

import importlib
import importlib.util

from cloudtrain.config import Config
from cloudtrain.errors import NotAvailableError
from cloudtrain.providers.base import Provider

# name -> module implementing `make_provider(config) -> Provider`
_MODULES = {
    "local": "cloudtrain.providers.local",
    "ssh": "cloudtrain.providers.ssh",
    "aws": "cloudtrain.providers.aws",
}
KNOWN = ("local", "ssh", "aws", "gcp", "azure")


def available() -> tuple[str, ...]:
    return tuple(name for name in _MODULES if importlib.util.find_spec(_MODULES[name]) is not None)


def get_provider(name: str, config: Config) -> Provider:
    module_name = _MODULES.get(name)
    if module_name is None or importlib.util.find_spec(module_name) is None:
        raise NotAvailableError(
            f"cloud {name!r} is not available yet in this cloudtrain",
            hint=f"available: {', '.join(available())}",
        )
    module = importlib.import_module(module_name)
    return module.make_provider(config)
