"""Recovery says what happened once (issue 35.12): a preempted spot run printed the loss three times
(`node gone: ...` and `...: relaunching (attempt 2)` on stderr, then the recover phase). Now the
job's phase ends naming the loss, and the recover phase alone says why and what comes next."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.recovery import finish, kept, placement, preempt, recipe, start

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def test_a_preempted_run_says_the_loss_once(fake_cloud: Any, tmp_path: Path) -> None:
    cloud = fake_cloud("aws")
    marks = tmp_path / "marks"
    marks.mkdir()
    proc = start(cloud, recipe(cloud, marks))
    try:
        kept(cloud, at_least=3)
        where, machine = placement(cloud)
        preempt(cloud, where, machine)
        out, err = finish(proc, marks)
    finally:
        (marks / "go").touch()
    assert proc.returncode == 0, out + err
    both = out + err
    assert both.count(f"{machine} terminated") == 1, both  # the cloud's words, once
    assert "<== run FAILED" in out and "the node is gone" in out.split("<== run FAILED", 1)[1].splitlines()[0]
    recover = [line for line in out.splitlines() if line.startswith(("==> recover", "<== recover"))]
    assert len(recover) == 2 and "preempted" in recover[0] and "attempt 2 of up to" in recover[1], recover
    assert "relaunching" not in err and "node gone" not in err, err
