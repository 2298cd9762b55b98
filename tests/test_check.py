"""`cloudtrain check`: the library core and the command, AWS answered by moto's server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from cloudtrain.providers.check import NOT_AVAILABLE, check_clouds, usable
from cloudtrain.config import AwsConfig, Config
from cloudtrain.errors import UsageError
from cloudtrain.providers.aws.api import NO_CREDENTIALS
from cloudtrain.testing.aws import MotoServer, isolate_aws_env
from cloudtrain.providers import available
from tests.conftest import cloudtrain

AWS_OK = "credentials from environment variables, account 123456789012, region eu-west-1"


def without_credentials(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    env = {k: v for k, v in moto_server.env().items() if not k.startswith(("AWS_ACCESS", "AWS_SECRET"))}
    isolate_aws_env(monkeypatch, tmp_path, env)


def test_every_known_cloud_gets_one_line(moto_server: MotoServer) -> None:
    statuses = check_clouds(Config(aws=AwsConfig(region="eu-west-1")))
    by_cloud = {s.cloud: s for s in statuses}
    assert [s.cloud for s in statuses] == ["local", "ssh", "aws", "gcp", "azure", "slurm"]
    # Backends whose machines are given (ssh hosts, a Slurm login node) need no credentials of their own.
    assert by_cloud["local"].ok and by_cloud["ssh"].ok and by_cloud["slurm"].ok
    assert by_cloud["aws"].ok and by_cloud["aws"].detail == AWS_OK
    # Without their credentials (or their provider, in this build) the other clouds say why, in one line.
    for cloud in ("gcp", "azure"):
        assert not by_cloud[cloud].ok and by_cloud[cloud].detail
        if cloud not in available():
            assert by_cloud[cloud].detail == NOT_AVAILABLE
    assert usable(statuses) == ["local", "ssh", "aws", "slurm"]
    assert all("\n" not in s.detail for s in statuses)


def test_aws_without_credentials(moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    without_credentials(moto_server, monkeypatch, tmp_path)
    (status,) = check_clouds(Config(), ["aws"])
    assert (status.cloud, status.ok, status.detail) == ("aws", False, NO_CREDENTIALS)


def test_aws_with_a_missing_profile(moto_server: MotoServer) -> None:
    (status,) = check_clouds(Config(aws=AwsConfig(profile="research")), ["aws"])
    assert not status.ok and "research" in status.detail and "aws.profile" in status.detail


def test_unknown_cloud_name_suggests_the_right_one() -> None:
    with pytest.raises(UsageError) as caught:
        check_clouds(Config(), ["azur"])
    assert caught.value.one_line() == "unknown cloud 'azur' (did you mean 'azure'?)"


def test_command_reports_and_exits_by_the_clouds_asked_for(
    moto_server: MotoServer, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    everything = cloudtrain("check")
    assert everything.returncode == 0, everything.stderr
    lines = everything.stdout.splitlines()
    assert lines[0].split() == ["CLOUD", "STATUS", "DETAIL"]
    assert any(line.split()[:2] == ["aws", "ok"] and line.endswith(AWS_OK) for line in lines)
    # gcp has no credentials in the test (or no provider in this build): one line saying so.
    assert any(line.split()[:2] == ["gcp", "no"] for line in lines)

    asked = cloudtrain("check", "aws", "--json")
    assert asked.returncode == 0, asked.stderr
    assert json.loads(asked.stdout) == [{"cloud": "aws", "ok": True, "detail": AWS_OK}]

    assert cloudtrain("check", "gcp").returncode == 1  # asked for a cloud that is not usable

    without_credentials(moto_server, monkeypatch, tmp_path)
    refused = cloudtrain("check", "aws")
    assert refused.returncode == 1
    assert refused.stdout.splitlines()[1].split()[:2] == ["aws", "no"]
    assert refused.stdout.splitlines()[1].endswith(NO_CREDENTIALS)

    typo = cloudtrain("check", "awz")
    assert typo.returncode == 2 and "did you mean 'aws'" in typo.stderr
