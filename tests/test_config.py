"""Config file: validated like recipes, one clear line for each mistake."""

from __future__ import annotations

from pathlib import Path

import pytest

from cloudtrain.config import Config, load_config
from cloudtrain.errors import ConfigError
from tests.conftest import cloudtrain


def test_defaults_when_missing(tmp_path: Path) -> None:
    assert load_config(tmp_path / "none.yaml") == Config()


def test_full_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "runs_dir: /data/runs\n"
        "ssh: {proxy_command: 'ssh -W %h:%p bastion', connect_timeout_s: 5, allowed_cidr: 203.0.113.7/32}\n"
        "aws: {region: eu-west-1, profile: work}\n"
        "gcp: {project: p, api_endpoint: 'http://127.0.0.1:1'}\n"
        "azure: {subscription_id: s, arm_endpoint: 'https://127.0.0.1:2'}\n"
    )
    config = load_config(path)
    assert config.ssh.proxy_command == "ssh -W %h:%p bastion"
    assert config.aws.region == "eu-west-1" and config.gcp.api_endpoint == "http://127.0.0.1:1"


@pytest.mark.parametrize(
    "text,expected",
    [
        ("runs_dri: x\n", "did you mean 'runs_dir'"),
        ("ssh: {conect_timeout_s: 3}\n", "ssh.conect_timeout_s"),
        ("ssh: {connect_timeout_s: -3}\n", "greater than 0"),
        ("aws: [us-east-1]\n", "aws"),
        ("ssh: {proxy_command: [a\n", "YAML syntax error"),
    ],
)
def test_bad_config(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert expected in info.value.one_line() and str(path) in info.value.one_line()


def test_runs_dir_from_config(tmp_path: Path, cloudtrain_home: Path) -> None:
    cloudtrain_home.mkdir(parents=True, exist_ok=True)
    (cloudtrain_home / "config.yaml").write_text(f"runs_dir: {tmp_path / 'elsewhere'}\n")
    (tmp_path / "r.yaml").write_text("name: cfg\nrun: echo hi\n")
    proc = cloudtrain("run", "r.yaml", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert Path(proc.stdout.strip().splitlines()[-1]).parent == tmp_path / "elsewhere"


def test_bad_config_is_exit_2_for_cli(tmp_path: Path, cloudtrain_home: Path) -> None:
    cloudtrain_home.mkdir(parents=True, exist_ok=True)
    (cloudtrain_home / "config.yaml").write_text("bogus: 1\n")
    (tmp_path / "r.yaml").write_text("name: cfg\nrun: echo hi\n")
    proc = cloudtrain("run", "r.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and "bogus" in proc.stderr and "Traceback" not in proc.stderr
