"""Two members of one team database on the AWS fake (issue 37): what one member's verbs may do with
the other's clusters. `gc` (even `--all-owners --yes`) lists nothing of a teammate's live work, a
cluster or a launch in flight, and says whose it is; `stop`/`down` of a teammate's cluster is
refused in one line (exit 2) without `--force`, and with it done and recorded (who did it); a CLI
SIGKILLed while it holds a cluster (PostgreSQL's session advisory lock) frees it at once, so the
other member's `down --force` proceeds. The setup (two database roles, two HOMEs, one database)
is test_team_budget_e2e's."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.postgres import connection as pg_connection
from tests.e2e.test_team_budget_e2e import _cli, _member_env, team_db  # noqa: F401 - team_db: a fixture

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)

LIVE = ("pending", "running", "stopping", "stopped")


def _wait_for(what: str, check: Callable[[], bool], within_s: float) -> float:
    """Poll `check` until it holds; the seconds it took. A condition, never a fixed sleep."""
    started = time.monotonic()
    while not check():
        if time.monotonic() - started > within_s:
            raise AssertionError(f"not within {within_s:.0f} s: {what}")
        time.sleep(0.05)
    return time.monotonic() - started


def _lock_holders(admin: str, cluster: str) -> int:
    """Sessions holding cluster `cluster`'s advisory lock (state/locks.py: keys 0x6374, hashtext)."""
    from cloudtrain.state.locks import CLUSTER_LOCK_SPACE

    with pg_connection(admin) as conn:
        return conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 2 "
            "AND classid = %s AND objid::bigint = (hashtext(%s)::bigint + 4294967296) %% 4294967296",
            (CLUSTER_LOCK_SPACE, cluster)).fetchone()[0]


def _events(admin: str, cluster: str) -> list[tuple[str, str, str]]:
    with pg_connection(admin) as conn:
        return [tuple(r) for r in conn.execute("SELECT kind, member, message FROM events WHERE cluster = %s "
                                               "ORDER BY id", (cluster,)).fetchall()]


def _one_error(stderr: str) -> str:
    errors = [line for line in stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, stderr
    return errors[0]


def test_a_teammates_cluster_is_not_a_leak_and_is_stopped_or_ended_only_with_force(
        aws_cloud: AwsCloud, team_db, tmp_path: Path) -> None:  # noqa: ANN001
    _admin, urls, roles = team_db
    admin = _admin
    alice, bob = (_member_env(aws_cloud, tmp_path / who, url, who) for who, url in zip(("alice", "bob"), urls))
    recipe = str(aws_cloud.recipe(run="true"))
    name = aws_cloud.new_cluster("a")
    up = _cli(alice, "up", recipe, "--cluster", name)
    assert up.returncode == 0, up.stderr
    (instance,) = aws_cloud.instances(name, LIVE)

    # Bob's gc over every owner's tags, removing what it finds: nothing of alice's, said whose.
    found = _cli(bob, "gc", "--cloud", "aws", "--all-owners", "--json")
    assert found.returncode == 0, found.stdout + found.stderr
    document = json.loads(found.stdout)
    assert document["leaks"] == [] and document["live"] == []
    assert document["teammates"] == [{"cluster": name, "member": roles[0], "cloud": "aws", "status": "up"}]
    removed = _cli(bob, "gc", "--cloud", "aws", "--all-owners", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert "nothing leaked" in removed.stdout
    assert "1 cluster(s) belong to teammates" in removed.stdout and f"{roles[0]}: {name}" in removed.stdout
    assert [i["State"]["Name"] for i in aws_cloud.instances(name)] == ["running"]

    # stop and down of alice's cluster: one line each, exit 2, nothing done.
    for verb in ("stop", "down"):
        refused = _cli(bob, verb, name)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        line = _one_error(refused.stderr)
        assert f"cluster {name} is {roles[0]}'s" in line and f"`cloudtrain {verb} {name} --force`" in line, line
    assert [i["State"]["Name"] for i in aws_cloud.instances(name)] == ["running"]
    assert not [e for e in _events(admin, name) if e[0].endswith("-forced")]

    # With --force: done, and recorded with who did it.
    stopped = _cli(bob, "stop", name, "--force")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert [i["State"]["Name"] for i in aws_cloud.instances(name)] == ["stopped"]
    ended = _cli(bob, "down", name, "--force")
    assert ended.returncode == 0, ended.stdout + ended.stderr
    assert [i["State"]["Name"] for i in aws_cloud.instances(name)] == ["terminated"]
    forced = [(kind, member, message) for kind, member, message in _events(admin, name) if kind.endswith("-forced")]
    assert forced == [("stop-forced", roles[1], f"{roles[1]} ran `stop --force` on {roles[0]}'s cluster"),
                      ("down-forced", roles[1], f"{roles[1]} ran `down --force` on {roles[0]}'s cluster")]
    # Alice's key pair and security group went with it (they carry her owner tag, not bob's).
    assert aws_cloud.leftovers() == []
    assert instance["InstanceId"] == aws_cloud.instances(name)[0]["InstanceId"]


def test_a_member_killed_while_holding_a_cluster_frees_it_for_the_other(
        aws_cloud: AwsCloud, team_db, tmp_path: Path) -> None:  # noqa: ANN001
    admin, urls, roles = team_db
    alice, bob = (_member_env(aws_cloud, tmp_path / who, url, who) for who, url in zip(("alice", "bob"), urls))
    recipe = str(aws_cloud.recipe(run="true"))
    name = aws_cloud.new_cluster("k")
    # EC2 launches alice's instance and its answer is held: her `up` holds the cluster, in flight.
    gate = aws_cloud.faults.hold("RunInstances", after=True)
    proc = subprocess.Popen([sys.executable, "-m", "cloudtrain", "up", recipe, "--cluster", name], env=alice,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("alice's up parked in RunInstances", lambda: gate.wait_held(0.05) or proc.poll() is not None, 120)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        assert _lock_holders(admin, name) == 1
        # One connection per CLI (issue 37): mid-launch, alice's up holds the cluster lock, writes
        # its launch heartbeat from a thread and has its store open, all on one session.
        with pg_connection(admin) as conn:
            seen = conn.execute("SELECT pid, state, query FROM pg_stat_activity WHERE usename = %s",
                                (roles[0],)).fetchall()
        connections = len(seen)
        assert connections == 1, seen

        # Her launch in flight is not a leak to bob's gc, whatever the owner tag.
        found = _cli(bob, "gc", "--cloud", "aws", "--all-owners", "--json")
        assert found.returncode == 0, found.stdout + found.stderr
        document = json.loads(found.stdout)
        assert [leak for leak in document["leaks"] + document["live"] if leak["cluster"] == name] == []
        assert [m["cluster"] for m in document["teammates"]] == [name]

        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        gate.release()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)
        if proc.stderr:
            proc.stderr.close()
    # The server ends the dead CLI's session and its lock with it: no stale lock to wait out.
    freed_in = _wait_for("the killed CLI's cluster lock freed", lambda: _lock_holders(admin, name) == 0, 10)
    (orphan,) = aws_cloud.instances(name, LIVE)

    refused = _cli(bob, "down", name)
    assert refused.returncode == 2 and f"is {roles[0]}'s" in _one_error(refused.stderr), refused.stderr
    started = time.monotonic()
    ended = _cli(bob, "down", name, "--force")
    took = time.monotonic() - started
    assert ended.returncode == 0, ended.stdout + ended.stderr
    assert [i["State"]["Name"] for i in aws_cloud.instances(name)] == ["terminated"]
    assert orphan["InstanceId"] == aws_cloud.instances(name)[0]["InstanceId"]
    assert aws_cloud.leftovers() == []
    status = _cli(alice, "status", "--all-users", "--json")
    assert name not in {c["name"] for c in json.loads(status.stdout)["clusters"]}
    print(f"alice's up held {connections} connection(s); lock freed {freed_in:.2f} s after SIGKILL; "
          f"bob's down --force took {took:.1f} s")
