"""What a cluster's node identity may do in object storage: exactly the recipe's buckets.

One description (`BucketGrant`) that every provider turns into its own cloud's policy: an IAM
role's policy on AWS, a bucket-level role binding for the VM's service account on GCP, a Storage
Blob Data role assignment on the container for the VM's managed identity on Azure.
"""

from __future__ import annotations

from dataclasses import dataclass

from cloudtrain.buckets.url import BucketUrl, parse_bucket_url


@dataclass(frozen=True)
class BucketGrant:
    url: BucketUrl
    write: bool  # False: list and read under the prefix; True: also write under it (uploads)


def grants_for(data_sources: list[str] | tuple[str, ...], upload: str | None) -> tuple[BucketGrant, ...]:
    """Read on every bucket data source, write on the upload prefix; one grant per URL."""
    grants: dict[str, BucketGrant] = {}
    for source in data_sources:
        if "://" in source:
            url = parse_bucket_url(source)
            grants.setdefault(str(url), BucketGrant(url, write=False))
    if upload is not None:
        url = parse_bucket_url(upload)
        grants[str(url)] = BucketGrant(url, write=True)
    return tuple(grants.values())


def recipe_grants(recipe: object) -> tuple[BucketGrant, ...]:
    """The grants a recipe's nodes need (`Recipe`: duck-typed to keep this module import-light)."""
    data = getattr(recipe, "data", [])
    return grants_for([m.source for m in data], getattr(recipe, "upload", None))
