"""Standard Webhooks signatures (https://www.standardwebhooks.com), so that a receiver can check a
delivery with any of the spec's verifiers. cloudtrain/node/tell.py signs the node's events with the
same few lines (it runs on the node with the standard library only)."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets

SECRET_PREFIX = "whsec_"


class BadSecret(ValueError):
    """A signing secret that is not whsec_ followed by base64."""


def secret_key(secret: str) -> bytes:
    """The HMAC key: the base64-decoded bytes after `whsec_` (the prefix is optional, as in the spec)."""
    text = secret.strip()
    if text.startswith(SECRET_PREFIX):
        text = text[len(SECRET_PREFIX):]
    try:
        key = base64.b64decode(text + "=" * (-len(text) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise BadSecret("expected whsec_ followed by base64 (`cloudtrain events --new-secret` makes one)") from None
    if len(key) < 16:
        raise BadSecret(f"the key is {len(key)} bytes; use at least 16 (24-64 is usual)")
    return key


def signature(key: bytes, msg_id: str, timestamp: int, body: str) -> str:
    """`v1,<base64 HMAC-SHA256 of "{id}.{timestamp}.{body}">`."""
    digest = hmac.new(key, f"{msg_id}.{timestamp}.{body}".encode(), hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def headers(key: bytes, msg_id: str, timestamp: int, body: str) -> dict[str, str]:
    """The three headers of one delivery attempt: the id is the event's (the same on every retry,
    receivers deduplicate on it); the timestamp is the attempt's (receivers refuse old ones)."""
    return {"webhook-id": msg_id, "webhook-timestamp": str(timestamp),
            "webhook-signature": signature(key, msg_id, timestamp, body)}


def new_secret() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(32)).decode()
