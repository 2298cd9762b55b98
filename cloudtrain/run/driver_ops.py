"""`cloudtrain driver status|log|fetch|cancel RUN`: a driven run (run/driver.py), seen from the laptop.

Each opens one SSH connection to the driver host named in `runs/<run id>/driver.json` and reads
the drive's directory there; nothing here touches a cloud: the driven `cloudtrain run` on the host
owns the cluster, as the laptop's own `run` would.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from cloudtrain.errors import CloudtrainError, UsageError
from cloudtrain.run.driver import (START_WAIT_S, DriverError, DriveState, DriverRecord, Probe, connect, log_tail,
                                   login, probe, terminate)

LOG_CHUNK = 1 << 20  # bytes of driver.log read per request: a log without newlines cannot fill memory
FOLLOW_POLL_S = 1.0


@dataclass(frozen=True)
class DriveStatus:
    record: DriverRecord
    probe: Probe
    attempts: tuple[dict[str, Any], ...]  # the run's attempts.json so far (a recovering run)
    run_json: dict[str, Any] | None  # once the run has ended


def _read_json(transport, path: str) -> Any:  # noqa: ANN001
    result = transport.run(["head", "-c", str(LOG_CHUNK), path], check=False, timeout=60)
    if result.exit_code != 0:
        return None
    try:
        return json.loads(result.stdout)
    except (ValueError, RecursionError):
        return None


def status(config, record: DriverRecord) -> DriveStatus:  # noqa: ANN001
    transport = connect(record.driver_host(), config)
    try:
        seen = probe(transport, record.remote_dir)
        attempts = _read_json(transport, f"{record.remote_run_dir}/attempts.json")
        ended = seen.state in (DriveState.ENDED, DriveState.GONE)
        run_json = _read_json(transport, f"{record.remote_run_dir}/run.json") if ended else None
    finally:
        transport.close()
    listed = tuple(a for a in attempts if isinstance(a, dict)) if isinstance(attempts, list) else ()
    return DriveStatus(record, seen, listed, run_json if isinstance(run_json, dict) else None)


def follow_log(config, record: DriverRecord, write: Callable[[str], None], *, follow: bool,  # noqa: ANN001
               sleep: Callable[[float], None] = time.sleep) -> Probe:
    """Print the driven `cloudtrain run`'s own output (driver.log: its phases, the job's lines, its
    summary); with `follow`, until it ends. Returns how it stands at the end."""
    transport = connect(record.driver_host(), config)
    offset, pending = 0, b""
    try:
        while True:
            seen = probe(transport, record.remote_dir)  # before the read: what ended is read whole
            while True:
                chunk = transport.run(["sh", "-c", 'tail -c +"$2" "$1" 2>/dev/null | head -c "$3"', "sh",
                                       f"{record.remote_dir}/driver.log", str(offset + 1), str(LOG_CHUNK)],
                                      check=False, timeout=120, what="reading the driven run's log").stdout
                offset += len(chunk)
                lines = (pending + chunk).split(b"\n")
                pending = lines.pop()
                for line in lines:
                    write(line.decode(errors="replace"))
                if len(chunk) < LOG_CHUNK:
                    break
            if not follow or seen.state in (DriveState.ENDED, DriveState.GONE):
                if pending:
                    write(pending.decode(errors="replace"))
                return seen
            sleep(FOLLOW_POLL_S)
    finally:
        transport.close()


@dataclass(frozen=True)
class Fetched:
    run_dir: Path
    files: int
    refused: tuple[str, ...]
    state: DriveState


def fetch(config, record: DriverRecord, runs_dir: Path) -> Fetched:  # noqa: ANN001
    """The driven run's directory brought home into `runs/<run id>/` (beside driver.json), verified
    against a listing made on the host; only once the run has ended (it is still being written)."""
    transport = connect(record.driver_host(), config)
    try:
        seen = probe(transport, record.remote_dir)
        if seen.state in (DriveState.RUNNING, DriveState.STARTING):
            raise UsageError(f"run {record.run_id} is still running on {record.host}",
                             hint=f"`cloudtrain driver log {record.run_id} -f` follows it; "
                                  f"`cloudtrain driver cancel {record.run_id}` stops it")
        listed = transport.run(["ls", "-A", record.remote_run_dir], timeout=60, what="listing the driven run's directory")
        names = listed.stdout.decode(errors="surrogateescape").split("\n")
        names = [n for n in names if n and n != "driver.json"]  # the laptop's own record stays as it is
        local = runs_dir / record.run_id
        local.mkdir(parents=True, exist_ok=True)
        listing, got = transport.get_tree_listed(record.remote_run_dir, names, local)
    finally:
        transport.close()
    refused = {r.member for r in got.refused}
    wrong = sorted(n for n, size in listing.items() if n not in refused and got.sizes.get(n) != size)
    if wrong:
        raise CloudtrainError(f"run {record.run_id}: {len(wrong)} file(s) did not arrive whole, e.g. {wrong[0]}",
                              hint=f"`cloudtrain driver fetch {record.run_id}` again")
    return Fetched(local, len(got.sizes), tuple(sorted(refused)), seen.state)


def cancel(config, record: DriverRecord, say: Callable[[str], None]) -> Probe:  # noqa: ANN001
    """Stop the driven run (run/driver.terminate: SIGTERM, then its own teardown); waits until it has ended."""
    transport = connect(record.driver_host(), config)
    try:
        return terminate(transport, record.remote_dir, say, f"run {record.run_id}")
    finally:
        transport.close()


def resume(config, record: DriverRecord, runs_dir: Path, say: Callable[[str], None],  # noqa: ANN001
           sleep: Callable[[float], None] = time.sleep) -> DriverRecord:
    """The driven run's process died (killed, the host restarted): start it again on the host as
    `cloudtrain run recipe.yaml --resume RUN` (run/recover.resume: relaunch from the checkpoint kept
    there), in the same drive directory, and wait until it has started a new attempt."""
    transport = connect(record.driver_host(), config)
    try:
        seen = probe(transport, record.remote_dir)
        if seen.state in (DriveState.RUNNING, DriveState.STARTING):
            raise UsageError(f"run {record.run_id} is still driven on {record.host} (process {seen.pid})",
                             hint=f"`cloudtrain driver status {record.run_id}` shows where it is")
        attempts = _read_json(transport, f"{record.remote_run_dir}/attempts.json")
        before = len(attempts) if isinstance(attempts, list) else 0
        quoted = shlex.quote(record.remote_dir)
        # The old processes' pid files and exit code go: they describe processes that are over.
        transport.run(login(f"cd {quoted} || exit 1; rm -f pid exit_code wrapper; setsid nohup sh drive.sh "
                            f"--resume {shlex.quote(record.run_id)} >>driver.log 2>&1 </dev/null &"),
                      timeout=120, what="resuming the driven run")
        say(f"waiting for `cloudtrain run --resume {record.run_id}` on {record.host} to start a new attempt "
            f"(up to {START_WAIT_S:.0f} s)")
        deadline = time.monotonic() + START_WAIT_S
        while True:
            seen = probe(transport, record.remote_dir)
            if seen.state in (DriveState.ENDED, DriveState.GONE):
                if seen.exit_code == 0:
                    break
                lines = [line for line in log_tail(transport, record.remote_dir) if line.startswith("error:")]
                raise DriverError(f"run {record.run_id}: `cloudtrain run --resume` on {record.host} ended (exit "
                                  f"{seen.exit_code}): {lines[-1] if lines else 'see its log'}",
                                  exit_code=seen.exit_code or 1,
                                  hint=f"`cloudtrain driver log {record.run_id}` prints its log")
            now = _read_json(transport, f"{record.remote_run_dir}/attempts.json")
            if seen.state == DriveState.RUNNING and isinstance(now, list) and len(now) > before:
                break
            if time.monotonic() > deadline:
                raise CloudtrainError(f"run {record.run_id}: no new attempt on {record.host} within "
                                      f"{START_WAIT_S:.0f} s", hint=f"`cloudtrain driver log {record.run_id}`")
            sleep(0.5)
    finally:
        transport.close()
    resumed = replace(record, pid=seen.pid or record.pid, started_at=time.time())
    resumed.write(runs_dir / record.run_id)
    return resumed
