"""Upload on an interruption notice (a recovering run whose recipe has `upload:`, docs/recovery.md).

Before each attempt's job starts, the CLI leaves a script on node 0 beside the watchdog's config
(`~/.cloudtrain/<cluster>/on_notice.sh`, SCRIPT). On the cloud's interruption notice the watchdog
(cloudtrain/node/notices.py), which TERMs the job, also starts that script: it waits for the job to end
(so the last checkpoint, written on TERM, is complete), then puts the run's result paths and its
checkpoint directory under the run's upload URL with the node's own identity (the same copy tool
and identity as the run's own upload step: buckets/steps.py), and writes what it uploaded, and how
the copy ended, in `on_notice.json`. The CLI reads that file while the node still runs and records
it in the attempt (`uploaded_on_notice`). Everything it needs is decided here, on the laptop, so
the watchdog only starts a file it finds: it needs no bucket logic of its own.

When the node is gone before it said what it uploaded, or during the run's own upload at its end,
the laptop lists or finishes the upload itself (run/recover_bucket.py); the Recovery's side of
both is here (`after_notice`, `final_upload`).
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Callable
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from cloudtrain.errors import CloudtrainError
# The script the watchdog starts on a notice, and its record of the notice (with the jobs it TERMed):
# the node protocol's names.
from cloudtrain.node.protocol import NOTICE_FILE as NOTICE_FILE
from cloudtrain.node.protocol import NOTICE_SCRIPT as SCRIPT

if TYPE_CHECKING:
    from cloudtrain.cluster.nodes import Node
    from cloudtrain.recipe import Recipe
    from cloudtrain.run.recovering import Recovering

RESULT = "on_notice.json"
LOG = "on_notice.log"
# How long the script waits for the TERMed job to end before uploading what there is: inside every
# cloud's warning (GCP's and Azure's 30 s; the watchdog KILLs the job after 20 s there).
JOB_END_WAIT_S = 25
# How long the CLI waits for on_notice.json once it found the notice (the job's end, then the copy;
# bounded by the warning: after that the machine is gone anyway).
READ_WAIT_S = 120.0


def arm(node: Node, provider: object, recipe: Recipe, run_id: str, job_id: str, checkpoint_rel: str) -> str | None:
    """Leave the script (and the copy tool) on node 0 for this attempt; the upload URL, or None."""
    from cloudtrain.buckets.steps import identity_of, node_env, put_copy_tool, upload_destination, upload_script

    dest = upload_destination(recipe, run_id)
    if dest is None:
        return None
    identity, who = identity_of(provider, node.record.cluster)
    paths = list(dict.fromkeys([*recipe.result_paths(), checkpoint_rel]))
    text = _wrap(node, str(dest), paths, job_id, upload_script(dest, paths, node_env(identity, who)))
    put_copy_tool([node])
    node.transport.put_file(text.encode(), f"{node.layout.root}/{SCRIPT}", mode=0o700)
    return str(dest)


def _wrap(node: Node, dest: str, paths: list[str], job_id: str, body: str) -> str:
    layout = node.layout
    done = json.dumps({"url": dest, "paths": paths})[:-1] + ', "exit_code": '
    tmp, result = f"{layout.root}/.{RESULT}.tmp", f"{layout.root}/{RESULT}"
    return "\n".join([
        "#!/bin/sh",
        "# Started by the watchdog on an interruption notice (cloudtrain/run/recover_upload.py).",
        "# Only for the job the notice TERMed: a script an earlier run left on a reused cluster uploads nothing.",
        f"grep -q {shlex.quote(json.dumps(job_id))} {shlex.quote(f'{layout.root}/{NOTICE_FILE}')} || exit 0",
        f"cd {shlex.quote(layout.workdir)} || exit 3",
        f"export CLOUDTRAIN_RUNTIME={shlex.quote(layout.runtime)}",
        f"export CLOUDTRAIN_PYTHON={shlex.quote(node.python or 'python3')}",
        "# The job was TERMed: its last checkpoint is complete once it has ended.",
        f"i=0; while [ ! -e {shlex.quote(layout.job_dir(job_id) + '/exit_code')} ] && [ \"$i\" -lt {JOB_END_WAIT_S * 10} ]; do",
        "  sleep 0.1; i=$((i + 1))",
        "done",
        f"(\n{body}) > {shlex.quote(f'{layout.root}/{LOG}')} 2>&1",
        "code=$?",
        f"printf '%s%s, \"at\": %s}}\\n' {shlex.quote(done)} \"$code\" \"$(date +%s)\" > {shlex.quote(tmp)}",
        f"mv -f {shlex.quote(tmp)} {shlex.quote(result)}",
        "",
    ])


def read(node: Node, wait_s: float = READ_WAIT_S) -> dict[str, Any] | None:
    """What the on-notice upload did, once it has finished (None: no answer before the node went,
    or `wait_s` passed). Asked while the node still runs, after the notice was found."""
    deadline = time.monotonic() + wait_s
    path = f"{node.layout.root}/{RESULT}"
    while True:
        try:
            seen = node.transport.run(["cat", path], check=False, what="reading the upload on notice")
        except CloudtrainError:
            return None  # the node went: what it uploaded is in the bucket, unrecorded
        if seen.exit_code == 0:
            try:
                data = json.loads(seen.text)
            except ValueError:
                return {"error": f"unreadable {RESULT}"}
            if isinstance(data, dict):
                data["ok"] = data.get("exit_code") == 0
                return data
        if time.monotonic() > deadline:
            return None
        time.sleep(1.0)


# ------------------------------------------------------------------------- what a Recovery does with it


def after_notice(rec: Recovering) -> dict[str, Any]:
    """What the upload on the notice did (on_notice.json, once written), or, when the node did not
    say (it went first, or never finished), what the bucket holds under the run's prefix, listed
    from this machine. The prefix is the run's, so an earlier attempt's upload is listed too
    (`modified` tells them apart)."""
    from cloudtrain.buckets.steps import upload_destination
    from cloudtrain.run.recover_bucket import list_uploaded

    reporter, node = rec.ex.reporter, rec.r.nodes[0]
    done = read(node)
    if done is not None:
        if done.get("ok"):
            reporter.info(f"uploaded on the interruption notice: {', '.join(done.get('paths') or [])} "
                          f"to {done.get('url')}")
        else:
            reporter.warn(f"the upload on the interruption notice failed (exit {done.get('exit_code')}; "
                          f"see {node.layout.root}/{LOG} on the node)")
        return done
    url = str(upload_destination(rec.r.loaded.recipe, rec.r.run_id))
    listed = list_uploaded(url)
    if "error" in listed:
        reporter.warn(f"the upload on the interruption notice did not answer before the node went, and {url} could "
                      f"not be listed from this machine: {listed['error']}")
    else:
        reporter.warn(f"the upload on the interruption notice did not answer before the node went; {url} holds "
                      f"{listed['count']} object(s) (listed from this machine)")
    return {"url": url, "ok": None, "answered": False, "listed_at": time.time(), **listed}


def final_upload(rec: Recovering, step: Callable[[], object]) -> None:
    """The run's own upload at its end (`upload:`, after the last attempt collected) with the cloud
    watcher on again. Its node lost meanwhile (the watcher saw it, or the cloud, asked now, says
    so) while the results are home: the run does not fail for the lost node. A relaunch would be
    overkill for a copy: this machine has the results and the user's credentials, so it finishes
    the upload itself and the last attempt's `final_upload` says so; where it cannot, that record
    names the one command that does, and the run fails for the upload, as an upload that failed on
    a node that is still there does."""
    from cloudtrain.buckets.steps import upload_destination
    from cloudtrain.errors import CloudtrainError
    from cloudtrain.run.recover_bucket import put_from_laptop
    from cloudtrain.run.recover_rules import NodeLostError

    last = rec.attempts[-1]
    watcher = rec.watch()  # its token, set on a loss, makes the upload's connections give up
    try:
        step()
        return
    except CloudtrainError as exc:
        collected = rec.r.collected
        why, detected_at = rec.gone_now()
        if why is None or collected is None or not collected.complete:
            raise  # the node is there (or the results are not home): it failed on its own
        failure = exc
    finally:
        watcher.stop()
    url = str(upload_destination(rec.r.loaded.recipe, rec.r.run_id))
    rec.ex.reporter.warn(f"the node went while it uploaded the results ({why}); the results are home: "
                         "finishing the upload from this machine")
    done = put_from_laptop(url, rec.r.run_dir, rec.r.loaded.recipe.result_paths(), why, detected_at,
                           rec.ex.reporter.info)
    last.final_upload = asdict(done)
    rec.save()
    if done.ok:
        rec.ex.reporter.info(f"uploaded the results to {url} from this machine")
        return
    raise NodeLostError(f"upload {url} not done: the node went while it uploaded ({why}) and this machine could "
                        f"not finish it: {done.error}",
                        hint=f"the results are in {rec.r.run_dir}; finish it with: {done.finish}") from failure
