"""`recover:` in a recipe: what `run` does when its node is preempted or lost (docs/recovery.md).

    recover: {max_restarts: 3}     # relaunch up to 3 times, resuming from the newest checkpoint
    recover: true                  # the defaults
    recover: false                 # a lost node fails the run (also for spot)

Left out, it is on (DEFAULT_RECOVER) for `resources.spot: true`, where losing the node is the
price of the discount, and off for on-demand machines, which rarely go away (opt in with
`recover: true` against hardware loss). Machines cloudtrain does not own (`local`, `ssh`) have no
placement to move to: preflight refuses an explicit `recover:` there.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import Field

from cloudtrain.config import StrictModel


class Recover(StrictModel):
    max_restarts: Annotated[int, Field(ge=0, le=20, description="relaunches after a lost node; 0: none")] = 3
    watch_s: Annotated[float, Field(ge=1, le=300, description=(
        "while the job runs, how often the cloud is asked whether the node is still there (a node "
        "that stops answering is asked about at once)"))] = 10.0


DEFAULT_RECOVER = Recover()


def recover_input(value: Any) -> Any:
    """`recover: true` is the defaults, `recover: false` none; a bare number gets the line to write."""
    if value is True:
        return {}
    if value is False:
        return None
    if isinstance(value, (int, float)):
        raise ValueError(f"write it as a mapping: `recover: {{max_restarts: {value:g}}}` (`recover: false` for none)")
    if isinstance(value, str):
        raise ValueError("expected a mapping such as `recover: {max_restarts: 3}`, true, or false")
    return value
