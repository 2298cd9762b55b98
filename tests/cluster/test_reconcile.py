"""reconcile: (record, nodes, open intervals, observations) -> transition, as a table (issue 22)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cloudtrain.cluster.reconcile import Observation, Pricing, Source, observe, reconcile
from cloudtrain.providers.base import Instance, InstanceState as S
from cloudtrain.state import BillingRecord, ClusterRecord, ClusterStatus, NodeRecord

pytestmark = pytest.mark.quick

T0 = 1_700_000_000.0
PRICE = Pricing(running=1.0, disk=0.01, min_s=60.0)
REC = ClusterRecord(name="c", provider="aws", status=ClusterStatus.UP, region="r", zone=None, instance_type="t",
                    hourly_price=1.0, num_nodes=1, recipe_path=None, recipe_digest=None, owner="o",
                    created_at=T0, updated_at=T0, last_error=None, uid="u1")


def node(iid: str, state: S, rank: int = 0) -> NodeRecord:
    return NodeRecord("c", rank, iid, state.value, None, None, None, None, None, None, T0)


def interval(iid: str, kind: str, at: float = T0) -> BillingRecord:
    return BillingRecord(0, "c", "aws", iid, kind, 1.0 if kind == "running" else 0.01, at, None, "u1", 0.0, "verb")


def obs(iid: str, state: S, at: float, source: Source = Source.CLOUD, billed: bool | None = None) -> Observation:
    return Observation(Instance(iid, "c", state, launched_at=T0, compute_billed=billed), at, source)


# (name, status before, nodes before, open intervals, observations, complete,
#  expected status, expected ops as (open?, id, kind, at))
CASES = [
    ("create answered: compute and disk open at the answer",
     ClusterStatus.PROVISIONING, [], [], [obs("i-1", S.PENDING, T0 + 1, Source.VERB)], False,
     ClusterStatus.PROVISIONING, [(True, "i-1", "disk", T0), (True, "i-1", "running", T0 + 1)]),
    ("watchdog stopped it an hour ago: compute closes at the cloud's time, not now",
     ClusterStatus.UP, [node("i-1", S.RUNNING)], [interval("i-1", "running"), interval("i-1", "disk")],
     [obs("i-1", S.STOPPED, T0 + 3600)], True,
     ClusterStatus.STOPPED, [(False, "i-1", "running", T0 + 3600)]),
    ("started again: compute reopens, the disk stays open",
     ClusterStatus.STOPPED, [node("i-1", S.STOPPED)], [interval("i-1", "disk")],
     [obs("i-1", S.RUNNING, T0 + 7200, Source.VERB)], True,
     ClusterStatus.UP, [(True, "i-1", "running", T0 + 7200)]),
    ("adopted after a crash: billed from its launch, at the row's price",
     ClusterStatus.PROVISIONING, [], [], [obs("i-9", S.RUNNING, T0 + 30)], True,
     ClusterStatus.PROVISIONING, [(True, "i-9", "disk", T0), (True, "i-9", "running", T0 + 30)]),
    ("first seen already stopped (answer lost, then stopped): it ran from its launch to the stop",
     ClusterStatus.PROVISIONING, [], [], [obs("i-9", S.STOPPED, T0 + 40, Source.VERB)], True,
     ClusterStatus.STOPPED, [(True, "i-9", "running", T0), (False, "i-9", "running", T0 + 40),
                             (True, "i-9", "disk", T0)]),
    ("first seen deleted (a failed launch's cleanup terminated it): its whole life is billed",
     ClusterStatus.PROVISIONING, [], [], [obs("i-8", S.TERMINATED, T0 + 2, Source.VERB)], True,
     ClusterStatus.PROVISIONING, [(True, "i-8", "running", T0), (False, "i-8", "running", T0 + 2),
                                (True, "i-8", "disk", T0), (False, "i-8", "disk", T0 + 2)]),
    ("gone without a trace: closed when we looked (an upper bound)",
     ClusterStatus.UP, [node("i-1", S.RUNNING)], [interval("i-1", "running"), interval("i-1", "disk")], [], True,
     ClusterStatus.TERMINATED, [(False, "i-1", "disk", T0 + 500), (False, "i-1", "running", T0 + 500)]),
    ("EC2 stopping bills no compute",
     ClusterStatus.UP, [node("i-1", S.RUNNING)], [interval("i-1", "running"), interval("i-1", "disk")],
     [obs("i-1", S.STOPPING, T0 + 90, billed=False)], True,
     ClusterStatus.UP, [(False, "i-1", "running", T0 + 90)]),
    ("Azure stopped from inside (allocated) still bills compute",
     ClusterStatus.UP, [node("i-1", S.RUNNING)], [interval("i-1", "running"), interval("i-1", "disk")],
     [obs("i-1", S.STOPPING, T0 + 90)], True, ClusterStatus.UP, []),
    ("a partial observation leaves other nodes alone",
     ClusterStatus.UP, [node("i-1", S.RUNNING), node("i-2", S.RUNNING, 1)],
     [interval("i-1", "running"), interval("i-2", "running")], [obs("i-1", S.TERMINATED, T0 + 100)], False,
     ClusterStatus.UP, [(False, "i-1", "running", T0 + 100)]),
    ("an unknown state changes nothing",
     ClusterStatus.UP, [node("i-1", S.RUNNING)], [interval("i-1", "running")], [obs("i-1", S.UNKNOWN, T0 + 5)], True,
     ClusterStatus.UP, []),
    ("an open interval of a machine nobody knows any more ends",
     ClusterStatus.UP, [], [interval("i-lost", "running")], [], True,
     ClusterStatus.TERMINATED, [(False, "i-lost", "running", T0 + 500)]),
    ("a close never goes before its open",
     ClusterStatus.UP, [node("i-1", S.RUNNING)], [interval("i-1", "running", T0 + 50)],
     [obs("i-1", S.TERMINATED, T0 + 10)], True,
     ClusterStatus.TERMINATED, [(False, "i-1", "running", T0 + 50)]),
    ("a pre-v5 'stopped' interval ends when the node runs again; a disk opens",
     ClusterStatus.STOPPED, [node("i-1", S.STOPPED)], [interval("i-1", "stopped")],
     [obs("i-1", S.RUNNING, T0 + 60, Source.VERB)], True,
     ClusterStatus.UP, [(False, "i-1", "stopped", T0 + 60), (True, "i-1", "disk", T0 + 60),
                        (True, "i-1", "running", T0 + 60)]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_reconcile_table(case) -> None:  # noqa: ANN001
    _, status, nodes, open_, observations, complete, want_status, want_ops = case
    t = reconcile(replace(REC, status=status), nodes, open_, observations, PRICE, complete=complete, at=T0 + 500)
    assert t.status == want_status
    got = sorted((op.open, op.instance_id, str(op.kind), op.at) for op in t.billing)
    assert got == sorted(want_ops)
    for op in t.billing:
        if op.open and str(op.kind) == "running":
            assert (op.hourly_price, op.min_s) == (1.0, 60.0)


def test_unpriced_machines_bill_nothing() -> None:
    t = reconcile(REC, [], [], [obs("n-0", S.RUNNING, T0)], replace(PRICE, priced=False), complete=True, at=T0)
    assert t.billing == () and [n.instance_id for n in t.nodes] == ["n-0"]


def test_launch_done_ends_provisioning_and_found_nodes_keep_observed_order() -> None:
    observations = [obs("i-b", S.RUNNING, T0), obs("i-a", S.RUNNING, T0)]
    t = reconcile(replace(REC, status=ClusterStatus.PROVISIONING), [], [], observations, PRICE, complete=True,
                  launch_done=True, at=T0)
    assert t.status == ClusterStatus.UP and [(n.rank, n.instance_id) for n in t.nodes] == [(0, "i-b"), (1, "i-a")]


@pytest.mark.parametrize(("state_since", "verb_at", "source", "at"), [
    (T0 + 3, None, Source.CLOUD, T0 + 3),
    (None, T0 + 2, Source.VERB, T0 + 2),
    (T0 + 3, T0 + 2, Source.VERB, T0 + 2),  # our own call brackets the change more closely than 1 s
    (None, None, Source.LOOKED, T0 + 9),
    (T0 + 20, None, Source.CLOUD, T0 + 9),  # a cloud clock ahead of ours never puts a change in the future
])
def test_observation_time_comes_from_the_best_source(state_since, verb_at, source, at) -> None:  # noqa: ANN001
    o = observe(Instance("i", "c", S.STOPPED, state_since=state_since), T0 + 9, verb_at)
    assert (o.source, o.at) == (source, at)


def test_reconcile_is_idempotent() -> None:
    """Applying the same observations to the state they produced changes nothing more."""
    first = reconcile(REC, [node("i-1", S.RUNNING)], [interval("i-1", "running"), interval("i-1", "disk")],
                      [obs("i-1", S.STOPPED, T0 + 100)], PRICE, complete=True, at=T0 + 200)
    still_open = [interval("i-1", "disk")]
    again = reconcile(replace(REC, status=first.status), first.nodes, still_open, [obs("i-1", S.STOPPED, T0 + 100)],
                      PRICE, complete=True, at=T0 + 300)
    assert again.billing == () and again.status == first.status and again.nodes == first.nodes


def test_the_disks_real_size_corrects_the_open_interval() -> None:
    """The create answer does not size the disks; the first listing that does amends the price."""
    priced = Pricing(running=1.0, disk=0.01, min_s=60.0, disk_per_gb=0.001)
    seen = Observation(Instance("i-1", "c", S.RUNNING, disk_gb=8), T0 + 5, Source.CLOUD)
    t = reconcile(REC, [node("i-1", S.RUNNING)], [interval("i-1", "running"), interval("i-1", "disk")], [seen],
                  priced, complete=True, at=T0 + 5)
    assert [(op.amend, str(op.kind), op.hourly_price, op.at) for op in t.billing] == [(True, "disk", 0.008, T0)]


def test_an_earlier_incarnations_leftover_is_not_adopted() -> None:
    """A reused name: an instance the earlier incarnation left (its `down` failed) carries the
    name's tag but not this incarnation's; it is neither adopted nor billed here."""
    stray = Observation(Instance("i-old", "c", S.RUNNING, launched_at=T0, incarnation="u0"), T0, Source.CLOUD)
    mine = Observation(Instance("i-new", "c", S.RUNNING, launched_at=T0, incarnation="u1"), T0, Source.CLOUD)
    t = reconcile(REC, [], [], [stray, mine], PRICE, complete=True, at=T0)
    assert [n.instance_id for n in t.nodes] == ["i-new"]
    assert {op.instance_id for op in t.billing} == {"i-new"}
    assert ("foreign", "i-old belongs to incarnation u0") in t.events


# The cloud acted before our verb (issue: `cost` 1.61x / 4.8x the bill after a watchdog stop) ------

def ops_of(t) -> list[tuple[bool, str, str, float]]:  # noqa: ANN001
    return sorted((op.open, op.instance_id, str(op.kind), op.at) for op in t.billing)


@pytest.mark.parametrize(("state", "closed"), [
    (S.STOPPED, ["running"]),  # the watchdog stopped it; `stop` an hour later
    (S.TERMINATED, ["disk", "running"]),  # autostop.down deleted it; `down` an hour later
])
def test_a_change_the_cloud_made_before_our_verb_keeps_the_clouds_time(state: S, closed: list[str]) -> None:
    """`stop` or `down` answered at T0+3600 finds a machine the cloud changed at T0+100 (its own
    transition time, from before our call): billing changed then, not when the command ran."""
    seen = observe(Instance("i-1", "c", state, launched_at=T0, state_since=T0 + 100), T0 + 3601, verb_at=T0 + 3600.4)
    assert (seen.source, seen.at) == (Source.CLOUD, T0 + 100)
    t = reconcile(REC, [node("i-1", S.RUNNING)], [interval("i-1", "running"), interval("i-1", "disk")], [seen],
                  PRICE, complete=True, at=T0 + 3601)
    assert ops_of(t) == [(False, "i-1", kind, T0 + 100) for kind in closed]


@pytest.mark.parametrize("state_since", [T0 + 3599, T0 + 3600, T0 + 3601])
def test_our_verbs_own_change_keeps_its_time(state_since: float) -> None:
    """The cloud's time of the change our own call made is that call's whole second, at or just
    before our answer (or after it, by a clock ahead of ours): the interval closes within that
    second, whichever of the two is taken."""
    seen = observe(Instance("i-1", "c", S.STOPPED, state_since=state_since), T0 + 3602, verb_at=T0 + 3600.4)
    t = reconcile(REC, [node("i-1", S.RUNNING)], [interval("i-1", "running"), interval("i-1", "disk")], [seen],
                  PRICE, complete=True, at=T0 + 3602)
    assert ops_of(t) == [(False, "i-1", "running", min(state_since, T0 + 3600))]


@pytest.mark.parametrize(("state_since", "opened"), [
    (T0, T0 + 7200),  # the first launch's time again (moto keeps LaunchTime): this start is ours
    (T0 + 7200, T0 + 7200),  # EC2 sets LaunchTime at every start: our start's own second
    (T0 + 7000, T0 + 7000),  # started from the console before our `start`: the cloud's time
])
def test_a_start_is_billed_from_this_start_never_from_an_earlier_one(state_since: float, opened: float) -> None:
    """A machine we saw stopped (last start known: T0) is started at T0+7200.6. A cloud start time
    not after the start we knew of is that old start: billing from it would bill the stopped hours."""
    seen = observe(Instance("i-1", "c", S.RUNNING, launched_at=state_since, state_since=state_since), T0 + 7205,
                   verb_at=T0 + 7200.6)
    t = reconcile(replace(REC, status=ClusterStatus.STOPPED), [node("i-1", S.STOPPED)], [interval("i-1", "disk")],
                  [seen], PRICE, complete=True, at=T0 + 7205)
    assert ops_of(t) == [(True, "i-1", "running", opened)]


# Whole seconds at both ends of an interval (issue: -1.29% on a killed sweep) -----------------------

def test_a_short_vm_is_billed_from_the_clouds_launch_second_to_its_stop_second() -> None:
    """EC2 launched it at T0+1.x (LaunchTime: T0+1), our create call was answered at T0+1.7, the
    watchdog stopped it at T0+71.x (StateTransitionReason: T0+71): 70 s of compute, as the cloud
    counts it, not 69.3 s (our sub-second answer against the cloud's truncated second)."""
    launched = Instance("i-1", "c", S.PENDING, launched_at=T0 + 1, state_since=T0 + 1)
    created = reconcile(replace(REC, status=ClusterStatus.PROVISIONING), [], [],
                        [observe(launched, T0 + 1.7, verb_at=T0 + 1.7)], PRICE, complete=False, at=T0 + 1.7)
    assert ops_of(created) == [(True, "i-1", "disk", T0 + 1), (True, "i-1", "running", T0 + 1)]
    open_ = [interval("i-1", "running", T0 + 1), interval("i-1", "disk", T0 + 1)]
    watchdog = observe(Instance("i-1", "c", S.STOPPED, state_since=T0 + 71), T0 + 95.3)
    stopped = reconcile(REC, [node("i-1", S.RUNNING)], open_, [watchdog], PRICE, complete=True, at=T0 + 95.3)
    assert ops_of(stopped) == [(False, "i-1", "running", T0 + 71)]


def test_times_of_our_own_clock_are_whole_seconds_too() -> None:
    """Where the cloud gives no time (our verb's answer, when we looked), the ledger takes the same
    truncated second, so no interval has one end of each kind."""
    answered = observe(Instance("i-1", "c", S.STOPPED), T0 + 62.5, verb_at=T0 + 61.8)
    t = reconcile(REC, [node("i-1", S.RUNNING), node("i-2", S.RUNNING, 1)],
                  [interval("i-1", "running"), interval("i-1", "disk"), interval("i-2", "running"),
                   interval("i-2", "disk")], [answered], PRICE, complete=True, at=T0 + 500.37)
    assert ops_of(t) == [(False, "i-1", "running", T0 + 61),
                         (False, "i-2", "disk", T0 + 500), (False, "i-2", "running", T0 + 500)]


# An abandoned launch intent (issue 34.3): its creator died before the create's answer.
INTENT = replace(REC, status=ClusterStatus.PROVISIONING, num_nodes=2, deadline_at=T0 + 900)


def test_an_abandoned_intent_whose_machine_the_cloud_still_reports_ended_is_billed_its_life_and_settled() -> None:
    ended = Observation(Instance("i-7", "c", S.TERMINATED, launched_at=T0 + 3, incarnation="u1"), T0 + 95, Source.CLOUD)
    t = reconcile(INTENT, [], [], [ended], PRICE, complete=True, abandoned=True, at=T0 + 4000)
    assert t.status is ClusterStatus.TERMINATED
    assert [(o.open, o.instance_id, str(o.kind), o.at) for o in t.billing] == [
        (True, "i-7", "running", T0 + 3), (False, "i-7", "running", T0 + 95),
        (True, "i-7", "disk", T0 + 3), (False, "i-7", "disk", T0 + 95)]


@pytest.mark.parametrize(("at", "final", "end"), [
    (T0 + 5000, False, T0 + 900),  # long after: it cannot have outlived its deadline
    (T0 + 300, False, T0 + 300),  # not listed now: it ended by now at the latest
    (T0 + 5, True, T0 + 5),  # `down` forgets the cluster: the last look books it at once
])
def test_an_abandoned_intent_the_cloud_forgot_is_booked_at_its_worst_case_as_an_estimate(
        at: float, final: bool, end: float) -> None:
    t = reconcile(INTENT, [], [], [], PRICE, complete=True, abandoned=True, final=final, at=at)
    assert t.status is ClusterStatus.TERMINATED and [k for k, _ in t.events] == ["estimate"]
    opened = [o for o in t.billing if o.open]
    closed = [o for o in t.billing if not o.open]
    assert {(o.instance_id, str(o.kind), o.at, o.hourly_price, o.min_s) for o in opened} == {
        (f"estimate:u1:{r}", "running", T0, 1.0, 60.0) for r in (0, 1)} | {
        (f"estimate:u1:{r}", "disk", T0, 0.01, 0.0) for r in (0, 1)}
    assert {(o.instance_id, str(o.kind), o.at) for o in closed} == {
        (f"estimate:u1:{r}", k, end) for r in (0, 1) for k in ("running", "disk")}
    assert {o.source for o in t.billing} == {Source.ESTIMATE}


def test_an_empty_listing_right_after_the_intent_is_not_believed_yet() -> None:
    from cloudtrain.cluster.reconcile import LISTING_SETTLE_S

    t = reconcile(INTENT, [], [], [], PRICE, complete=True, abandoned=True, at=T0 + LISTING_SETTLE_S - 1)
    assert (t.status, t.billing) == (ClusterStatus.PROVISIONING, ())  # EC2 may not list it yet


def test_an_abandoned_intent_without_a_deadline_is_settled_with_nothing_booked() -> None:
    t = reconcile(replace(INTENT, deadline_at=None), [], [], [], PRICE, complete=True, abandoned=True, at=T0 + 10 ** 6)
    assert (t.status, t.billing, [k for k, _ in t.events]) == (ClusterStatus.TERMINATED, (), ["estimate"])


def test_no_estimate_while_the_creator_lives() -> None:
    t = reconcile(INTENT, [], [], [], PRICE, complete=True, abandoned=False, at=T0 + 10 ** 6)
    assert (t.status, t.billing) == (ClusterStatus.PROVISIONING, ())
