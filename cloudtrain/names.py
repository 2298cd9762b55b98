"""The one rule for recipe and cluster names, checked at every boundary that takes one.

A cluster name becomes a lock file name, a directory on nodes (`~/.cloudtrain/<name>`, removed
with `rm -rf` by `down`), a key directory and a cloud tag: it must never carry a path. Kept free
of pydantic so `status` and the CLI's argument parsing stay fast.
"""

from __future__ import annotations

import re

NAME_RE = re.compile(r"^[a-z][a-z0-9-]{0,38}[a-z0-9]$|^[a-z]$")
NAME_RULE = "1-40 lowercase letters, digits or '-', starting with a letter and not ending with '-'"


def check_cluster_name(name: str) -> str:
    """Return name if it is a valid cluster name, else raise UsageError (exit 2) saying why."""
    if NAME_RE.fullmatch(name):
        return name
    from cloudtrain.errors import UsageError

    suggestion = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")[:40].rstrip("-")
    if suggestion and not suggestion[0].isalpha():
        suggestion = f"c-{suggestion}"[:40].rstrip("-")
    # Verbs take the name as --cluster or positionally: suggest the name, not the flag.
    hint = f"a valid name: {suggestion}" if suggestion and NAME_RE.fullmatch(suggestion) else "pick another name"
    raise UsageError(f"cluster name {name!r} is not valid: it must be {NAME_RULE}", hint=hint)
