"""`runner.sh status` never calls a job that ended normally "lost" (templates/runner.sh).

The supervisor writes exit_code, then exits. A status that read exit_code (not there yet) and then
asked whether the supervisor lives (it had just exited) said "lost": a multi-node run whose worker
finished at that moment was failed as "job on node 1 lost" and its other nodes stopped (a CI
failure). The job ending between the two reads is made certain here: a `cat` on PATH ends the
"supervisor" right after status reads exit_code.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain import paths

RUNNER = paths.templates_dir() / "runner.sh"

# Reads like cat; right after a read of the job's exit_code finds none, the job ends the way the
# supervisor ends it: exit_code written, then the supervisor gone.
ENDING_CAT = """#!/bin/sh
/bin/cat "$@"
rc=$?
case "$1" in
*/exit_code)
    if [ ! -f "$1" ]; then
        echo 0 > "$1"
        kill -KILL "$SUPERVISOR"
        while [ -d "/proc/$SUPERVISOR" ] && ! grep -q ') Z ' "/proc/$SUPERVISOR/stat" 2>/dev/null; do :; done
    fi ;;
esac
exit $rc
"""


def test_a_job_that_ends_while_status_reads_it_is_running_or_over_never_lost(tmp_path: Path) -> None:
    job = tmp_path / "job"
    job.mkdir()
    shim = tmp_path / "bin"
    shim.mkdir()
    (shim / "cat").write_text(ENDING_CAT)
    (shim / "cat").chmod(0o755)
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (job / "pid").write_text(f"{supervisor.pid}\n")
        (job / "started_at").write_text("1\n")
        env = {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}", "SUPERVISOR": str(supervisor.pid)}
        first = json.loads(subprocess.run(["sh", str(RUNNER), "status", str(job)], env=env, check=True,
                                          capture_output=True, text=True, timeout=30).stdout)
        assert (job / "exit_code").exists()  # it did end between the reads
        # Seen alive before its exit_code was looked for: running (the next look says how it ended).
        assert first["state"] == "running", first
        second = json.loads(subprocess.run(["sh", str(RUNNER), "status", str(job)], env=env, check=True,
                                           capture_output=True, text=True, timeout=30).stdout)
        assert (second["state"], second["exit_code"]) == ("succeeded", 0), second
    finally:
        supervisor.kill()
        supervisor.wait()


def test_a_kill_answers_how_the_job_ended_so_the_node_may_be_gone_right_after(tmp_path: Path) -> None:
    """`cancel` used to ask the state in a second round trip; the run following the job had taken a
    local node down by then ("command not found: sh", a CI failure). The kill's own answer says it."""
    from cloudtrain.errors import RemoteError
    from cloudtrain.remote import jobs
    from cloudtrain.remote.jobs import JobState, NodeLayout
    from cloudtrain.remote.local import LocalTransport

    node_dir = tmp_path / "node"
    node = LocalTransport(node_dir)
    layout = NodeLayout(str(node_dir / ".cloudtrain" / "c"))
    jobs.install_runtime(node, layout)
    jobs.submit(node, layout, "j1", "sleep 60\n", {})
    ended = jobs.kill(node, layout, "j1", grace_s=2)
    assert ended is not None and ended.state == JobState.KILLED and ended.exit_code is not None
    assert jobs.kill(node, layout, "no-such-job") is None
    # Taken down: what it says is that, not a missing command.
    import shutil

    shutil.rmtree(node_dir)
    with pytest.raises(RemoteError, match="the node's directory is gone"):
        node.run(["sh", "-c", "true"])
