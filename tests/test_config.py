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
        # A duplicate key would silently keep only the last value.
        ("runs_dir: a\nruns_dir: b\n", ":2: duplicate key 'runs_dir' (first at line 1)"),
        ("aws:\n  region: us-east-1\n  profile: p\n  region: eu-west-1\n",
         ":4: aws: duplicate key 'region' (first at line 2)"),
        ("ssh: {connect_timeout_s: 3, connect_timeout_s: 5}\n", ":1: ssh: duplicate key 'connect_timeout_s' (first at line 1)"),
    ],
)
def test_bad_config(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert expected in info.value.one_line() and str(path) in info.value.one_line()


def test_duplicate_key_error_has_a_hint(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("gcp:\n  project: p\n  project: q\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert info.value.message == f"{path}:3: gcp: duplicate key 'project' (first at line 2)"
    assert info.value.hint and "delete one" in info.value.hint and info.value.exit_code == 2


def test_merge_keys_in_config(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("aws: &aws {region: eu-west-1}\ngcp:\n  <<: {project: p, api_endpoint: 'http://127.0.0.1:1'}\n  project: q\n")
    config = load_config(path)
    assert config.aws.region == "eu-west-1" and config.gcp.project == "q"
    assert config.gcp.api_endpoint == "http://127.0.0.1:1"


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


def test_ssh_include_is_on_by_default_and_can_be_turned_off(tmp_path: Path) -> None:
    """One decision, stated in the README: cloudtrain adds an Include to ~/.ssh/config unless told not to."""
    assert Config().ssh.add_include is True
    path = tmp_path / "config.yaml"
    path.write_text("ssh: {add_include: false}\n")
    assert load_config(path).ssh.add_include is False
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert "add_include: true" in readme
    assert "by default (as SkyPilot does)" in readme and "`add_include: false` keeps `~/.ssh/config` untouched" in readme


def test_tests_never_see_the_real_home(tmp_path: Path) -> None:
    """The suite's fixture gives every test its own HOME, so an Include can only land in a scratch dir."""
    import os

    assert Path(os.environ["HOME"]).resolve().is_relative_to(tmp_path.resolve())
