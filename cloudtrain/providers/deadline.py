"""The launch-time deadline every VM carries from its first second (docs/design/billing.md).

It is the backstop for a VM whose on-node watchdog was never installed (the CLI that launched it
died during boot): it fires DEADLINE_GRACE_S after the budget, so that a watchdog that is there
acts first, with its log and its exact accounting across stops and starts. Clouds with a native
limit use it (GCE's maxRunDuration); the others get a script in their launch request, run once by
cloud-init at first boot: templates/deadline.sh (EC2 user data: an OS shutdown, which EC2 makes a
stop or a termination) and templates/deadline_arm.sh (Azure custom data: an ARM deallocate or
delete with the VM's managed identity, since an OS shutdown keeps an Azure VM billed).
"""

from __future__ import annotations

import json
import math
import os
from typing import Any

from cloudtrain.errors import UsageError

DEADLINE_GRACE_S = 30
# Tests only (the kit's fakes run the real backstop in seconds): the grace in seconds. Never needed
# on a real cloud (docs/watchdog.md, "Test overrides").
GRACE_ENV = "CLOUDTRAIN_DEADLINE_GRACE_S"


def grace_s() -> int:
    """The backstop's grace after the budget: DEADLINE_GRACE_S, or the test override."""
    raw = os.environ.get(GRACE_ENV)
    if not raw:
        return DEADLINE_GRACE_S
    try:
        value = int(raw)
    except ValueError:
        raise UsageError(f"{GRACE_ENV}={raw!r} is not a whole number of seconds") from None
    if value < 0:
        raise UsageError(f"{GRACE_ENV} must be >= 0 seconds, got {raw}")
    return value


def deadline_seconds(max_run_s: float) -> int:
    """Seconds from first boot until the launch-time deadline fires."""
    return max(1, math.ceil(max_run_s)) + grace_s()


def _template(name: str) -> str:
    from cloudtrain import paths

    return (paths.templates_dir() / name).read_text()


def shutdown_script(max_run_s: float) -> str:
    """templates/deadline.sh for a machine that may run `max_run_s` seconds from its first boot."""
    return _template("deadline.sh").replace("__DEADLINE_S__", str(deadline_seconds(max_run_s)))


def http_action_script(max_run_s: float, action: dict[str, Any]) -> str:
    """templates/deadline_arm.sh: at the deadline, the watchdog's own `http` action (an API call with
    the machine's identity token from its metadata server; see Provider.watchdog_action)."""
    if action.get("kind") != "http":
        raise ValueError(f"a deadline script performs an http action, got {action.get('kind')!r}")
    text = json.dumps({k: action[k] for k in ("method", "url", "ok", "token")} | {"gone_ok": bool(action.get("gone_ok"))},
                      separators=(",", ":"))
    if "'" in text:  # it sits in single quotes in a shell script
        raise ValueError("a deadline action may not contain a single quote")
    return (_template("deadline_arm.sh").replace("__DEADLINE_S__", str(deadline_seconds(max_run_s)))
            .replace("__ACTION_JSON__", text))
