"""What preflight checks about a recipe's buckets before anything exists (no network call).

URLs are checked when the recipe loads (buckets/url.py). Here: that the nodes will have an identity
for each bucket's store. A cloud that creates its machines gives them an identity of their own
only for the stores its provider declares (`bucket_stores`, e.g. ("s3",)); machines it does not
own (local, ssh, a scheduler's) use the store credentials configured on them, for any store.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cloudtrain.buckets.url import parse_bucket_url
from cloudtrain.errors import UsageError

GRANT_WAIT_ENV = "CLOUDTRAIN_GRANT_PROPAGATION_S"


def propagation_override(environ: Mapping[str, str] | None = None) -> float | None:
    """CLOUDTRAIN_GRANT_PROPAGATION_S in seconds, None when unset; malformed: one line (preflight
    asks before anything exists, so a typo never fails a run after its machines are up)."""
    environ = os.environ if environ is None else environ
    text = environ.get(GRANT_WAIT_ENV, "").strip()
    if not text:
        return None
    try:
        return max(0.0, float(text))
    except ValueError:
        raise UsageError(f"{GRANT_WAIT_ENV}={text!r} is not a number of seconds",
                         hint=f"unset it, or e.g. {GRANT_WAIT_ENV}=120") from None


def _stores_of(cloud: str) -> tuple[str, ...] | None:
    """The stores `cloud`'s nodes get an identity for; None: any (they use configured credentials)."""
    from cloudtrain.providers import available, provider_class, traits

    if cloud not in available():
        return None  # refused elsewhere, with its own message
    if not traits(cloud).owns_machines:  # only machines a cloud creates and owns have an identity
        return None
    return tuple(getattr(provider_class(cloud), "bucket_stores", ()))


def bucket_problem(recipe: object, clouds: list[str]) -> tuple[str, str, str | None] | None:
    """(field, message, hint) for the first bucket the recipe's nodes could not reach, else None."""
    named = [(f"data.{i}.source", m.source) for i, m in enumerate(getattr(recipe, "data", [])) if m.is_bucket]
    upload = getattr(recipe, "upload", None)
    if upload:
        named.append(("upload", upload))
    for field, text in named:
        store = parse_bucket_url(text).store.value
        for cloud in clouds:
            stores = _stores_of(cloud)
            if stores is not None and store not in stores:
                have = ", ".join(f"{s}://" for s in stores) or "none yet"
                return (field, f"{text}: cloud {cloud} cannot give its machines an identity for {store}:// buckets "
                               f"(it can for: {have})", "see docs/data.md; a bucket of the cloud the job runs on "
                                                       "is also the one without egress charges")
    return None
