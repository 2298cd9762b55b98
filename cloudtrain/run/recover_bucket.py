"""The laptop's own bucket work in a recovering run (run/recover_upload.py decides when).

With the user's own configured store credentials (as `collect --from-bucket` does,
buckets/fetch.py), running the same copy tool as the nodes (templates/bucket_copy.py) here, in a
process of its own (the store library's native runtime stays out of the CLI's process):

- `list_uploaded`: when the node went before the CLI could read `on_notice.json`, what the bucket
  holds under the run's prefix, so run.json says what is there even without the node's answer;
- `put_from_laptop`: when the node went during the run's own upload at its end (the results are
  home by then, collected inside the last attempt), the upload is finished from the run directory,
  which holds the result paths in the layout the node would have uploaded (relative to the workdir).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# What the laptop's own copy says it copies with (bucket_copy.py's error lines name it).
LAPTOP_WHO = "your configured store credentials"
# A listing recorded in run.json names at most this many objects (it says how many there were).
LISTED_MAX = 1000
# The laptop's bucket list: bounded, a store that does not answer must not hold a run's end.
LIST_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class FinalUpload:
    """The run's own upload at its end when the node went during it (run.json: the last attempt's
    `final_upload`): the results were home, so this machine finished the upload, or could not."""

    url: str
    node_lost: str  # why the node is gone (what the cloud, or the watcher, said)
    detected_at: float
    by: str  # "this machine" (the node's copy was cut by the loss)
    ok: bool
    paths: tuple[str, ...]
    exit_code: int | None
    error: str | None = None
    # Where it did not finish: the one command that does, from the run directory.
    finish: str | None = None


def _copy_tool() -> str:
    from cloudtrain import paths
    from cloudtrain.buckets.steps import COPY_SCRIPT

    return str(paths.templates_dir() / COPY_SCRIPT)


def _laptop_env() -> dict[str, str]:
    from cloudtrain.buckets.steps import node_env

    return {**os.environ, **node_env("configured", LAPTOP_WHO)}


def _no_obstore() -> str | None:
    if importlib.util.find_spec("obstore") is None:
        return "obstore is not installed here (pip install 'cloudtrain[buckets]')"
    return None


def finish_command(url: str, run_dir: Path, result_paths: Sequence[str]) -> str:
    """One shell line that uploads the run directory's results to `url` with your credentials.
    It carries the copy tool's settings this CLI had (the identity, and a store endpoint other
    than the cloud's own where one was configured: addresses, never credentials)."""
    from cloudtrain.buckets.steps import node_env

    settings = {k: v for k, v in node_env("configured", LAPTOP_WHO).items() if k != "CLOUDTRAIN_BUCKET_WHO"}
    words = [*(f"{k}={shlex.quote(v)}" for k, v in sorted(settings.items())),
             *(shlex.quote(w) for w in (sys.executable, _copy_tool(), "put", url, "--base", str(run_dir),
                                        *result_paths))]
    return " ".join(words)


def put_from_laptop(url: str, run_dir: Path, result_paths: Sequence[str], node_lost: str, detected_at: float,
                    say: Callable[[str], None]) -> FinalUpload:
    """Upload the result paths the run directory holds to `url` from this machine."""
    present = [p for p in result_paths if (run_dir / p).exists()]
    finish = finish_command(url, run_dir, present or list(result_paths))

    def record(ok: bool, code: int | None, error: str | None) -> FinalUpload:
        return FinalUpload(url, node_lost, detected_at, "this machine", ok, tuple(present), code, error,
                           None if ok else finish)

    if not present:
        return record(True, 0, None)  # nothing to upload: what collect brought is nothing either
    missing = _no_obstore()
    if missing is not None:
        return record(False, None, missing)
    say(f"upload {url} from this machine with {LAPTOP_WHO}")
    proc = subprocess.Popen([sys.executable, _copy_tool(), "put", url, "--base", str(run_dir), *present],
                            env=_laptop_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None and proc.stderr is not None
    for line in proc.stdout:
        say(line.rstrip("\n"))
    error = proc.stderr.read().strip()
    code = proc.wait()
    if code != 0:
        return record(False, code, error.splitlines()[-1] if error else f"bucket copy exit {code}")
    return record(True, 0, None)


_LIST = """
import json, os, sys
sys.path.insert(0, sys.argv[1])
import bucket_copy, obstore
def main():
    scheme, account, bucket, prefix = bucket_copy.parse_url(sys.argv[2])
    store = bucket_copy.make_store(scheme, account, bucket)
    found = []
    try:
        for batch in obstore.list(store, prefix=prefix or None, chunk_size=1000):
            for m in batch:
                found.append({"path": m["path"][len(prefix) + 1:] if prefix else m["path"], "size": m["size"],
                              "modified": round(m["last_modified"].timestamp(), 3)})
    except Exception as exc:
        bucket_url = f"{scheme}://{account + '/' if account else ''}{bucket}"
        return {"error": str(bucket_copy._translate(exc, scheme, bucket_url, "list"))}
    return {"objects": found}
print(json.dumps(main()), flush=True)
os._exit(0)
"""


def list_uploaded(url: str) -> dict[str, Any]:
    """What the bucket holds under `url`, listed from this machine: `objects` (path relative to
    `url`, size, modified; at most LISTED_MAX) and `count`, or `error`."""
    missing = _no_obstore()
    if missing is not None:
        return {"error": missing}
    try:
        done = subprocess.run([sys.executable, "-c", _LIST, str(Path(_copy_tool()).parent), url], env=_laptop_env(),
                              capture_output=True, text=True, timeout=LIST_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        return {"error": f"the store did not answer the listing within {LIST_TIMEOUT_S:.0f} s"}
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = done.stderr.strip().splitlines()
        return {"error": tail[-1] if tail else f"the listing ended with exit {done.returncode}"}
    if "error" in answer:
        return {"error": str(answer["error"])}
    objects = sorted(answer["objects"], key=lambda o: o["path"])
    return {"objects": objects[:LISTED_MAX], "count": len(objects)}
