"""cloudtrain watchdog: stops (or deletes) this machine when it is idle or over budget.

    python3 watchdog.pyz run    CONFIG   the loop: decide every tick_s, act, log every decision
    python3 watchdog.pyz check  CONFIG   what counts as activity right now, as one JSON line (acts on nothing)
    python3 watchdog.pyz ensure CONFIG   a new config on stdin (JSON): written if it changed; the loop started
                                         if none runs, surviving reboots where it can; one JSON line back
    python3 watchdog.pyz stop   CONFIG   end a running loop and remove its reboot hook

Standard library only, Python 3.8+: it runs on the node, whatever the job's environment is. The
laptop ships this package, cloudtrain/node, as one zipapp (bundle.py) to <runtime>/watchdog.pyz.
CONFIG is ~/.cloudtrain/<cluster>/watchdog.json; its fields and the files beside it: protocol.py.
"""

from __future__ import annotations

import json
import os
import sys
import time

from .files import read_json, running_pid
from .install import ensure, stop
from .jobs import observe_jobs
from .loop import Watchdog
from .protocol import Paths
from .signals import ssh_activity

MODES = ("run", "check", "ensure", "stop")


def check(config_path: str) -> dict:
    """What counts as activity right now (acts on nothing)."""
    paths = Paths(config_path)
    cfg = read_json(paths.config) or {}
    jobs = observe_jobs(paths, time.time())
    activity = ssh_activity(cfg.get("ssh_port")) if cfg.get("count_ssh") else None
    return {"jobs_running": jobs["running"], "jobs_starting": jobs["starting"], "jobs": jobs["all"],
            "ssh_sessions": activity[0] if activity else None,
            "ssh_kept_idle": activity[1] if activity else None,
            "ssh_port": cfg.get("ssh_port"), "running_pid": running_pid(paths),
            "budget_used_s": (read_json(paths.state) or {}).get("used_s")}


def main(argv: list) -> int:
    if len(argv) != 3 or argv[1] not in MODES:
        sys.stderr.write(__doc__.split("\n\n")[1] + "\n")
        return 2
    mode, config_path = argv[1], os.path.abspath(argv[2])
    if mode == "run":
        return Watchdog(config_path).run()
    if mode == "check":
        print(json.dumps(check(config_path)))
        return 0
    if mode == "stop":
        print(json.dumps(stop(config_path)))
        return 0
    new = json.load(sys.stdin)
    print(json.dumps(ensure(config_path, new, sys.executable, os.path.abspath(argv[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
