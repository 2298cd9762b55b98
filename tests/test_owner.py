"""The owner tag (issue 23 item 7): a stable identity the user controls, never the hostname, and
`gc --all-owners` to see what every owner left behind."""

from __future__ import annotations

import getpass
import socket
from pathlib import Path
from typing import Any

import pytest

from cloudtrain.config import Config, ConfigError, load_config
from cloudtrain.providers.base import InstanceSpec, owner_id
from tests.conftest import cloudtrain

OWNERS = [  # (config owner, $CLOUDTRAIN_OWNER, expected)
    ("team-ml", None, "team-ml"),
    ("team-ml", "ci-runner", "team-ml"),  # the config is the user's word
    (None, "CI Runner #7", "ci-runner--7"),  # sanitized to what every cloud takes as a tag value
    (None, None, getpass.getuser().lower()),
]


@pytest.mark.parametrize("configured,env,expected", OWNERS)
def test_the_owner_comes_from_the_config_then_the_environment_then_the_login(
    monkeypatch: pytest.MonkeyPatch, configured: str | None, env: str | None, expected: str
) -> None:
    if env is None:
        monkeypatch.delenv("CLOUDTRAIN_OWNER", raising=False)
    else:
        monkeypatch.setenv("CLOUDTRAIN_OWNER", env)
    assert owner_id(Config(owner=configured)) == expected


def test_the_default_owner_is_not_the_hostname(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CLOUDTRAIN_OWNER", raising=False)
    host = socket.gethostname().lower()
    assert host not in owner_id(Config()) or host == getpass.getuser().lower()


@pytest.mark.parametrize("bad", ["Team ML", "*", "-x", "a" * 64])
def test_an_owner_no_cloud_takes_as_a_tag_is_refused_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  bad: str) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(f"owner: {bad!r}\n")
    with pytest.raises(ConfigError, match="owner"):
        load_config(config)


def test_gc_all_owners_lists_what_another_owner_leaked(gce_server: Any, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("google.cloud.compute_v1")
    from cloudtrain.providers.gcp import GcpProvider
    from cloudtrain.remote.keys import cluster_key

    config = tmp_path / "config.yaml"
    endpoint = gce_server.config(region="us-central1")
    config.write_text("owner: laptop\ngcp: {" + ", ".join(f"{k}: {v}" for k, v in endpoint.items()) + "}\n")
    monkeypatch.setenv("CLOUDTRAIN_CONFIG", str(config))
    # What a CI runner of the same account left: another owner, no state here.
    GcpProvider(**endpoint).launch(InstanceSpec(
        cluster="from-ci", owner="ci-runner", instance_type="e2-standard-2", region="us-central1",
        ssh_public_key=cluster_key("from-ci").public_openssh, allowed_cidr="203.0.113.7/32"), 1)
    mine = cloudtrain("gc", "--cloud", "gcp")
    assert mine.returncode == 0 and "nothing leaked" in mine.stdout, mine.stdout + mine.stderr
    everyone = cloudtrain("gc", "--cloud", "gcp", "--all-owners")
    assert everyone.returncode == 1, everyone.stdout + everyone.stderr
    assert any("from-ci" in row and "instance" in row for row in everyone.stdout.splitlines())
    removed = cloudtrain("gc", "--cloud", "gcp", "--all-owners", "--yes")
    assert removed.returncode == 0, removed.stdout + removed.stderr
    assert gce_server.find_instances() == [] and gce_server.added_firewalls == {}
