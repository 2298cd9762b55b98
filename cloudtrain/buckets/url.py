"""Bucket URLs in recipes: parsed once, refused in one line when malformed."""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class Store(str, Enum):
    S3 = "s3"
    GCS = "gs"
    AZURE = "az"


# Naming rules from each store's reference: S3 "Bucket naming rules", GCS "Bucket names",
# Azure "Naming and referencing containers, blobs, and metadata" and storage account names.
_S3_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]")
_GCS_BUCKET = re.compile(r"[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]")
_AZ_ACCOUNT = re.compile(r"[a-z0-9]{3,24}")
_AZ_CONTAINER = re.compile(r"[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){2,62}")
_EXAMPLES = "s3://bucket/prefix, gs://bucket/prefix or az://account/container/prefix"


@dataclass(frozen=True)
class BucketUrl:
    store: Store
    bucket: str  # S3/GCS bucket; Azure: the container
    prefix: str = ""  # without leading or trailing '/'; "" is the whole bucket
    account: str = ""  # Azure storage account

    def __str__(self) -> str:
        where = f"{self.account}/{self.bucket}" if self.store is Store.AZURE else self.bucket
        return f"{self.store.value}://{where}" + (f"/{self.prefix}" if self.prefix else "")

    @property
    def bucket_url(self) -> str:
        """The bucket (Azure: account/container) without the prefix, as error messages name it."""
        return str(BucketUrl(self.store, self.bucket, "", self.account))

    def child(self, name: str) -> BucketUrl:
        return BucketUrl(self.store, self.bucket, "/".join(p for p in (self.prefix, name.strip("/")) if p),
                         self.account)


def is_bucket_url(text: str) -> bool:
    """A `scheme://` source: a bucket (or a malformed one), never a local path."""
    return "://" in text


def parse_bucket_url(text: str) -> BucketUrl:
    """`s3://bucket/prefix`, `gs://bucket/prefix`, `az://account/container/prefix`; ValueError
    with one line saying what is wrong otherwise."""
    scheme, sep, rest = text.partition("://")
    if not sep:
        raise ValueError(f"{text!r} is not a bucket URL; expected {_EXAMPLES}")
    try:
        store = Store(scheme.lower())
    except ValueError:
        raise ValueError(f"{text!r}: unknown store {scheme!r}; expected {_EXAMPLES}") from None
    if any(c.isspace() for c in rest) or "?" in rest or "#" in rest:
        raise ValueError(f"{text!r}: a bucket URL has no spaces, '?' or '#'")
    parts = [p for p in rest.split("/")]
    if store is Store.AZURE:
        if len(parts) < 2 or not parts[0] or not parts[1]:
            raise ValueError(f"{text!r}: az:// URLs name the storage account and the container: az://account/container/prefix")
        account, bucket, tail = parts[0], parts[1], parts[2:]
        if not _AZ_ACCOUNT.fullmatch(account):
            raise ValueError(f"{text!r}: storage account names are 3-24 lowercase letters and digits, got {account!r}")
        if not _AZ_CONTAINER.fullmatch(bucket):
            raise ValueError(f"{text!r}: container names are 3-63 lowercase letters, digits and single hyphens, "
                             f"got {bucket!r}")
    else:
        account, bucket, tail = "", parts[0], parts[1:]
        rule = _S3_BUCKET if store is Store.S3 else _GCS_BUCKET
        if not bucket:
            raise ValueError(f"{text!r}: no bucket name; expected {_EXAMPLES}")
        if not rule.fullmatch(bucket) or ".." in bucket:
            raise ValueError(f"{text!r}: bucket names are 3-63 lowercase letters, digits, '-' and '.' "
                             f"(starting and ending with a letter or digit), got {bucket!r}")
    if any(p in (".", "..") for p in tail):
        raise ValueError(f"{text!r}: '.' and '..' are not allowed in a bucket prefix")
    prefix = "/".join(p for p in tail if p)
    return BucketUrl(store, bucket, prefix, account)
