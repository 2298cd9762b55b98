"""The kit's cloud with connection reuse ON (issue 34.8's must-show): the test kit turns reuse off
for every other test, which is how no test saw `exec` after `start` fail on the previous boot's
kept connection. A two-node AWS cluster: exec (muxes kept), stop, start, exec again; a live
`autostop` on both nodes at once (the import race across node threads); down leaves no mux."""

from __future__ import annotations

import os

import pytest

from cloudtrain.testing import sshd
from cloudtrain.testing.aws import AwsCloud
from cloudtrain.testing.mux import mux_pids, stop_muxes

if not sshd.sshd_available() and not os.environ.get("CI"):
    pytest.skip("OpenSSH sshd is not installed (apt-get install openssh-server)", allow_module_level=True)


def test_two_nodes_with_kept_connections_survive_stop_start_and_a_live_autostop(
        aws_cloud: AwsCloud, monkeypatch: pytest.MonkeyPatch) -> None:
    from cloudtrain.remote.ssh import PERSIST_ENV

    monkeypatch.delenv(PERSIST_ENV, raising=False)  # reuse on, as users have it
    try:
        recipe = aws_cloud.recipe(run="true", num_nodes=2)
        up = aws_cloud.up(recipe)
        assert up.ok, up.output
        first = aws_cloud.cli("exec", aws_cloud.cluster, "--", "echo", "first")
        assert first.ok and "first" in first.stdout, first.output
        assert mux_pids(aws_cloud.home), "reuse is on: the exec left its node's mux"
        assert aws_cloud.cli("stop", aws_cloud.cluster).ok
        started = aws_cloud.cli("start", aws_cloud.cluster)
        assert started.ok, started.output
        again = aws_cloud.cli("exec", aws_cloud.cluster, "--", "echo", "again")
        assert again.ok and "again" in again.stdout, again.output
        assert "Broken pipe" not in again.output and "NodeRecord(" not in again.output
        live = aws_cloud.cli("autostop", aws_cloud.cluster, "-i", "30")
        assert live.ok and "partially initialized" not in live.output, live.output
        down = aws_cloud.down()
        assert down.ok, down.output
    finally:
        killed = stop_muxes(aws_cloud.home)
    assert not killed, f"mux process(es) {killed} ignored a stop request"
    assert aws_cloud.leftovers() == []
