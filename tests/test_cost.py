"""Spend is price x billed time over recorded intervals, with a controlled clock (issue 12.4)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cloudtrain.cluster.reconcile import Observation, Pricing, Source, reconcile
from cloudtrain.cost import HOURS_PER_MONTH, billing_minimum_s, disk_hourly, disk_price, flat_hourly, spend
from cloudtrain.providers.base import Instance
from cloudtrain.providers.base import InstanceState as S
from cloudtrain.state import ClusterStatus, StateStore
from tests.conftest import cli_env

T0 = 1_700_000_000.0  # a fixed clock (2023): every interval below starts here


def _cluster(store: StateStore, name: str, hourly_per_node: float, nodes: int = 1, cloud: str = "aws"):  # noqa: ANN202
    store.upsert_cluster(name=name, provider=cloud, status=ClusterStatus.PROVISIONING, num_nodes=nodes,
                         hourly_price=hourly_per_node * nodes, owner="me", created_at=T0)
    return store.get_cluster(name)


def _observe(store: StateStore, name: str, states: dict[str, S], at: float, cloud: str = "aws") -> None:
    """What a verb or a describe would feed the ledger: observations at `at`, reconciled and applied."""
    record = store.get_cluster(name)
    pricing = Pricing(running=record.hourly_price / record.num_nodes, disk=disk_hourly(cloud),
                      min_s=billing_minimum_s(cloud))
    observations = [Observation(Instance(i, name, s), at, Source.VERB) for i, s in states.items()]
    t = reconcile(record, store.get_nodes(name), store.open_billing(record.uid), observations, pricing,
                  complete=True, launch_done=True, at=at)
    store.apply(name, t, record.uid, cloud)


def test_running_then_stopped_then_running_then_down(cloudtrain_home) -> None:  # noqa: ANN001
    store = StateStore()
    _cluster(store, "c", 0.526, nodes=2)
    _observe(store, "c", {"i-1": S.RUNNING, "i-2": S.RUNNING}, T0)
    _observe(store, "c", {"i-1": S.STOPPED, "i-2": S.STOPPED}, T0 + 3600)  # 1 h running
    _observe(store, "c", {"i-1": S.RUNNING, "i-2": S.RUNNING}, T0 + 3 * 3600)  # 2 h stopped
    _observe(store, "c", {"i-1": S.TERMINATED, "i-2": S.TERMINATED}, T0 + 3.5 * 3600)  # 0.5 h running, then down
    # Compute while running; the disks for the whole 3.5 h they existed.
    expected = 2 * (1.5 * 0.526 + 3.5 * disk_hourly("aws"))
    got = spend(store.billing("c"), until=T0 + 10 * 3600)
    assert got.usd == pytest.approx(expected, rel=0.001)
    assert got.billed_s == pytest.approx(2 * 1.5 * 3600)
    assert not got.running
    # Clipped to a window: only what was billed inside it.
    window = spend(store.billing("c", since=T0 + 3 * 3600), since=T0 + 3 * 3600, until=T0 + 10 * 3600)
    assert window.usd == pytest.approx(2 * 0.5 * (0.526 + disk_hourly("aws")), rel=0.001)


def test_open_interval_bills_until_now(cloudtrain_home) -> None:  # noqa: ANN001
    store = StateStore()
    _cluster(store, "s", 0.2104)
    _observe(store, "s", {"i-9": S.RUNNING}, T0)
    got = spend(store.billing("s"), until=T0 + 1800)
    assert got.usd == pytest.approx(0.1052 + disk_hourly("aws") / 2, rel=0.001) and got.running


@pytest.mark.parametrize(("cloud", "minimum_s"), [("aws", 60), ("gcp", 60), ("azure", 300), ("local", 0)])
def test_a_short_start_is_billed_the_clouds_minimum(cloudtrain_home, cloud: str, minimum_s: float) -> None:  # noqa: ANN001
    """Issue 22.10: a 10 s VM costs 60 s on AWS and GCP, 300 s on Azure; every start counts again."""
    store = StateStore()
    _cluster(store, "f", 3.6, cloud=cloud)
    for start in (T0, T0 + 1000):
        _observe(store, "f", {"i-x": S.RUNNING}, start, cloud)
        _observe(store, "f", {"i-x": S.STOPPED}, start + 10, cloud)
    compute = [b for b in store.billing("f") if b.kind == "running"]
    assert spend(compute, until=T0 + 86400).usd == pytest.approx(2 * 3.6 * max(10, minimum_s) / 3600)
    # An open start is already worth its minimum.
    _observe(store, "f", {"i-x": S.RUNNING}, T0 + 2000, cloud)
    opened = [b for b in store.billing("f") if b.kind == "running" and b.ended_at is None]
    assert spend(opened, until=T0 + 2001).billed_s == pytest.approx(max(1, minimum_s))


def test_a_reused_name_starts_a_clean_history(cloudtrain_home) -> None:  # noqa: ANN001
    """Issue 22.2: billing is keyed by incarnation; a new cluster of the same name owes nothing old."""
    from cloudtrain.run.watchdog import running_seconds

    store = StateStore()
    first = _cluster(store, "same", 1.0)
    _observe(store, "same", {"i-old": S.RUNNING}, T0)
    _observe(store, "same", {"i-old": S.TERMINATED}, T0 + 170)
    store.delete_cluster("same")
    second = _cluster(store, "same", 1.0)
    assert second.uid != first.uid
    _observe(store, "same", {"i-new": S.RUNNING}, T0 + 200)
    assert running_seconds(store, "same", now=T0 + 210) == pytest.approx(10)
    assert {b.incarnation for b in store.billing("same")} == {first.uid, second.uid}


def test_cost_command_reports_per_cluster_and_total(cloudtrain_home) -> None:  # noqa: ANN001
    store = StateStore()
    _cluster(store, "a", 1.0)
    _observe(store, "a", {"i-1": S.RUNNING}, T0)
    _observe(store, "a", {"i-1": S.TERMINATED}, T0 + 1800)
    store.delete_cluster("a")
    proc = subprocess.run([sys.executable, "-m", "cloudtrain", "cost", "--json"], capture_output=True, text=True,
                          env=cli_env(), timeout=60)
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["total_usd"] == pytest.approx(0.5 + disk_hourly("aws") / 2, rel=0.001)
    assert data["clusters"][0]["cluster"] == "a" and data["clusters"][0]["status"] == "down"
    assert data["incarnations"][0]["from_iso"].startswith("2023-11-14T22:13:20")
    # Nothing billing, so nothing to ask a cloud: the config (pydantic) and the providers stay unloaded.
    timed = subprocess.run([sys.executable, "-X", "importtime", "-m", "cloudtrain", "cost"], capture_output=True,
                           text=True, env=cli_env(), timeout=60)
    assert timed.returncode == 0 and "0.5" in timed.stdout, timed.stderr[-2000:]
    loaded = {line.rsplit("|", 1)[1].strip() for line in timed.stderr.splitlines() if line.startswith("import time:")}
    assert {"cloudtrain.config", "pydantic", "cloudtrain.cluster.lifecycle"}.isdisjoint(loaded)
    bad = subprocess.run([sys.executable, "-m", "cloudtrain", "cost", "--since", "last tuesday"],
                         capture_output=True, text=True, env=cli_env(), timeout=60)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1 and "--since" in bad.stderr


def test_disk_and_flat_prices_come_from_the_storage_tables() -> None:
    # disks.csv: USD per GB-month; the hourly cost of a disk is that x size / hours in a month.
    assert disk_price("aws") == pytest.approx(0.08)  # EBS gp3 list price
    assert disk_hourly("aws", 50) == pytest.approx(disk_price("aws") * 50 / HOURS_PER_MONTH)
    assert all(disk_price(cloud) > 0 for cloud in ("aws", "gcp", "azure"))
    # A cloud the table lacks: no price (None), where disk_hourly (billing a stop) says 0.
    assert disk_price("elsewhere") is None and disk_hourly("elsewhere", 50) == 0.0
    # flat.csv: Azure's listed price of a Standard static IPv4 public IP, per hour.
    assert flat_hourly("azure", "public-ip") == 0.005
    assert flat_hourly("azure", "nat-gateway") is None and flat_hourly("elsewhere", "public-ip") is None


def test_runs_that_split_a_vms_life_add_up_to_its_bill_and_the_minimum_is_paid_once() -> None:
    """Issue 35.11: two short runs on one VM within its first minute each paid the whole minimum,
    so per-run rows summed past the bill. Windows now add up; the minimum belongs to the window
    that holds the start."""
    from cloudtrain.state import BillingRecord

    vm = BillingRecord(1, "c", "aws", "i-1", "running", 3.6, T0, T0 + 40, "u", 60.0, "verb")
    windows = [(T0 - 5, T0 + 10), (T0 + 10, T0 + 20), (T0 + 20, T0 + 3600)]
    shares = [vm.billed_seconds(until=b, since=a) for a, b in windows]
    assert shares == [60.0, 0.0, 0.0]  # the launch's run pays the minimum; the VM ran 40 s of it
    assert sum(shares) == vm.billed_seconds(until=T0 + 3600) == 60.0
    longer = BillingRecord(2, "c", "aws", "i-2", "running", 3.6, T0, T0 + 100, "u", 60.0, "verb")
    parts = [longer.billed_seconds(until=b, since=a) for a, b in [(T0 - 1, T0 + 30), (T0 + 30, T0 + 70),
                                                                     (T0 + 70, T0 + 200)]]
    assert parts == [60.0, 10.0, 30.0] and sum(parts) == 100.0
    assert longer.billed_seconds(until=T0 - 1) == 0.0  # nothing before it started


def test_a_window_from_within_the_starts_whole_second_holds_the_start() -> None:
    """A run that started at 100.6 and launched its VM at 100.9 (booked at 100, EC2's whole second)
    pays that VM's minimum: three recovery e2e under load paid only one of two minimums."""
    from cloudtrain.state import BillingRecord

    vm = BillingRecord(1, "c", "aws", "i-1", "running", 3.6, T0, T0 + 2, "u", 60.0, "cloud")
    assert vm.billed_seconds(until=T0 + 30, since=T0 + 0.6) == 60.0
    assert vm.billed_seconds(until=T0 + 30, since=T0 + 1.0) == 0.0  # a later second: past the start


def test_what_cost_holds_by_value_equals_its_source() -> None:
    """`cost` keeps reconcile's and the config's names by value (importing either costs a cold start
    tens of ms: the providers, pydantic): they must stay what those modules say."""
    from cloudtrain.cli import cost
    from cloudtrain.cluster import spend as spend_module
    from cloudtrain.config import OWNER_PATTERN

    assert spend_module.ESTIMATE == Source.ESTIMATE
    assert cost.OWNER_PATTERN == OWNER_PATTERN


@pytest.mark.parametrize(("config_text", "env_owner"), [
    (None, None), (None, "Alice Smith!"), ("owner: team-a\n", None), ("owner: team-a\n", "bob"),
    ("# the owner is the login name\nconfirm: false\n", None), ("owner:\n", "carol"), ("owner: 'x' \n", None)])
def test_machine_owner_is_owner_id_without_loading_the_config(cloudtrain_home, monkeypatch: pytest.MonkeyPatch,  # noqa: ANN001
                                                              config_text: str | None, env_owner: str | None) -> None:
    """`cost --all-users` on SQLite names this machine's owner as owner_id does, from a light read."""
    from cloudtrain.cli.cost import _load_config, machine_owner
    from cloudtrain.providers.base import owner_id

    if config_text is not None:
        cloudtrain_home.mkdir(parents=True, exist_ok=True)
        (cloudtrain_home / "config.yaml").write_text(config_text)
    if env_owner is None:
        monkeypatch.delenv("CLOUDTRAIN_OWNER", raising=False)
    else:
        monkeypatch.setenv("CLOUDTRAIN_OWNER", env_owner)
    assert machine_owner(_load_config) == owner_id(_load_config())


@pytest.mark.parametrize("config_text", ["owner: Not Valid\n", "owner: 7\n", "owner: [a]\n"])
def test_an_owner_the_light_read_cannot_vouch_for_fails_as_the_config_does(cloudtrain_home,  # noqa: ANN001
                                                                          config_text: str) -> None:
    from cloudtrain.cli.cost import _load_config, machine_owner
    from cloudtrain.errors import ConfigError

    cloudtrain_home.mkdir(parents=True, exist_ok=True)
    (cloudtrain_home / "config.yaml").write_text(config_text)
    with pytest.raises(ConfigError):
        _load_config()
    with pytest.raises(ConfigError):
        machine_owner(_load_config)


def test_cost_all_users_on_this_machine_names_its_owner_without_pydantic(cloudtrain_home) -> None:  # noqa: ANN001
    """Issue 37: the grouped report of this machine's ledger read the config (pydantic, ~0.3 s of
    import) only to name the owner of incarnations without a budget hold."""
    store = StateStore()
    _cluster(store, "a", 1.0)
    _observe(store, "a", {"i-1": S.RUNNING}, T0)
    _observe(store, "a", {"i-1": S.TERMINATED}, T0 + 1800)
    cloudtrain_home.joinpath("config.yaml").write_text("owner: team-a\nconfirm: false\n")
    timed = subprocess.run([sys.executable, "-X", "importtime", "-m", "cloudtrain", "cost", "--all-users"],
                           capture_output=True, text=True, env=cli_env(), timeout=60)
    assert timed.returncode == 0, timed.stderr[-2000:]
    assert timed.stdout.splitlines()[:2] == ["USER    SPENT  NODE-HOURS  CLUSTERS", "team-a  $0.51  0.50        1"]
    loaded = {line.rsplit("|", 1)[1].strip() for line in timed.stderr.splitlines() if line.startswith("import time:")}
    assert {"cloudtrain.config", "pydantic", "cloudtrain.cluster.reconcile", "cloudtrain.providers"}.isdisjoint(loaded)
