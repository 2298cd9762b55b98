"""Provider registry. Modules are imported only when a cloud is used, so the CLI stays fast.

Adding a cloud: a `providers/<cloud>/` package whose `make_provider(config)` is annotated with its
provider class (which declares `traits` and implements only the capability Protocols of base.py it
can), an entry below, catalog rows in catalog_data/, a fake in testing/ and a recipe. Nothing
outside providers/, testing/, catalog/ and config names a cloud.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import threading
import typing
from typing import TYPE_CHECKING

from cloudtrain.errors import NotAvailableError
from cloudtrain.providers.base import Schedules, Traits, supports

if TYPE_CHECKING:
    from cloudtrain.config import Config
    from cloudtrain.providers.base import Provider

# name -> module implementing `make_provider(config) -> Provider`
_MODULES = {
    "local": "cloudtrain.providers.local",
    "ssh": "cloudtrain.providers.ssh",
    "aws": "cloudtrain.providers.aws",
    "gcp": "cloudtrain.providers.gcp",
    "azure": "cloudtrain.providers.azure",
    "slurm": "cloudtrain.providers.slurm",
}
KNOWN = ("local", "ssh", "aws", "gcp", "azure", "slurm")
# Not a provider: the planner's choice among the clouds this cloudtrain can use.
ANY = "any"


def available() -> tuple[str, ...]:
    return tuple(name for name in _MODULES if importlib.util.find_spec(_MODULES[name]) is not None)


def _module(name: str):  # noqa: ANN202
    module_name = _MODULES.get(name)
    if module_name is None or importlib.util.find_spec(module_name) is None:
        if name == ANY:
            raise NotAvailableError("cloud any is not available yet", hint=f"name a cloud: {_or_list(available())}")
        raise NotAvailableError(
            f"cloud {name!r} is not available yet in this cloudtrain",
            hint=f"available: {', '.join(available())}",
        )
    return importlib.import_module(module_name)


# Providers made in this process: (cloud, id(config)) -> (config, environment, provider). The config
# is kept so its id cannot be reused by another object while the entry lives.
_made: dict[tuple[str, int], tuple[Config, frozenset[tuple[str, str]], Provider]] = {}
_made_lock = threading.Lock()
_MADE_MAX = 32


def get_provider(name: str, config: Config) -> Provider:
    """Cloud `name`'s provider for `config`: one per cloud, config object and environment in a
    process. A provider holds its SDK's clients, and a cloud client is costly to make (boto3 parses
    EC2's service model and builds ~600 methods: ~0.1 s of CPU); a recovering run that made a
    provider per lifecycle step made two dozen EC2 clients. The environment is part of the key
    because providers read it when made (endpoints, profiles, credentials)."""
    env = frozenset(os.environ.items())
    key = (name, id(config))
    with _made_lock:
        made = _made.get(key)
        if made is not None and made[0] is config and made[1] == env:
            return made[2]
    provider = _module(name).make_provider(config)
    with _made_lock:
        if len(_made) >= _MADE_MAX:
            _made.clear()  # tests make many configs; a CLI process makes one or two
        _made[key] = (config, env, provider)
    return provider


@functools.cache
def provider_class(name: str) -> type:
    """The provider class of `name`, without instantiating it (that could import an SDK or read
    credentials): `make_provider`'s return annotation. Provider modules import SDKs lazily."""
    module = _module(name)
    cls = typing.get_type_hints(module.make_provider).get("return")
    if cls is None or not isinstance(getattr(cls, "traits", None), Traits):
        raise TypeError(f"{module.__name__}.make_provider must be annotated with a provider class declaring traits")
    return cls


def traits(name: str) -> Traits:
    """Cloud `name`'s facts (priced, remote, ...) from its class; refuses what get_provider refuses."""
    return provider_class(name).traits


def implements(name: str, capability: type) -> bool:
    """Whether cloud `name` implements `capability` (a Protocol of providers/base.py), asked of its
    class: for callers that have only a name (recipe validation, preflight, planning, gc)."""
    return supports(provider_class(name), capability)


def schedules(name: str) -> bool:
    """Whether `name` is a scheduler that allocates nodes itself (Slurm): its provider builds one
    batch job (`batch_job`) for the whole run; `hosts` name its login node, not the nodes."""
    return name in available() and implements(name, Schedules)


def image_pins_region(name: str, image: str) -> bool:
    """Whether `image` exists in one region only (an AMI id): then failover cannot leave the region."""
    rule = getattr(provider_class(name), "image_pins_region", None)
    return bool(rule(image)) if rule is not None else False


def _or_list(names: tuple[str, ...]) -> str:
    return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else "".join(names)
