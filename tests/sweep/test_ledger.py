"""A sweep's spend from the billed intervals, per cluster incarnation (cloudtrain/sweep/ledger.py)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from cloudtrain.cost import spend
from cloudtrain.state.records import BillingRecord
from cloudtrain.sweep.ledger import gone_at, incarnations, sweep_spend, vm_spend

pytestmark = pytest.mark.quick


@dataclass
class Rows:
    """A BillingSource over fixed rows, with StateStore.billing's filters."""

    rows: list[BillingRecord]

    def billing(self, cluster: str | None = None, since: float = 0.0,
                incarnation: str | None = None) -> list[BillingRecord]:
        return [r for r in self.rows if (cluster is None or r.cluster == cluster)
                and (incarnation is None or r.incarnation == incarnation)
                and (r.ended_at is None or max(r.ended_at, r.started_at + r.min_s) > since)]


def row(n: int, cluster: str, start: float, end: float | None, *, inc: str | None = "u1", kind: str = "running",
        price: float = 3.6, min_s: float = 60.0) -> BillingRecord:
    return BillingRecord(id=n, cluster=cluster, cloud="aws", instance_id=f"i-{n}", kind=kind, hourly_price=price,
                         started_at=start, ended_at=end, incarnation=inc, min_s=min_s if kind == "running" else 0.0)


NOW = 10_000.0
CASES = [
    # (what, rows of sw-abc-0, its USD at NOW, its incarnations, gone_at)
    ("never billed", [], 0.0, [], None),
    ("a 10 s VM is billed the 60 s minimum", [row(1, "sw-abc-0", 100, 110)], 0.06, ["u1"], 110),
    ("a 2-node VM: each node its own start", [row(1, "sw-abc-0", 100, 200), row(2, "sw-abc-0", 100, 130)],
     0.1 + 0.06, ["u1"], 200),
    ("still running: billed until now, not gone", [row(1, "sw-abc-0", 9_000, None)], 1.0, ["u1"], None),
    ("a stopped spot VM's disk still bills", [row(1, "sw-abc-0", 100, 200),
                                              row(2, "sw-abc-0", 200, None, kind="disk", price=0.036)],
     0.1 + 0.036 * 9_800 / 3600, ["u1"], None),
    ("two incarnations of the name, both the VM's", [row(1, "sw-abc-0", 100, 200),
                                                     row(2, "sw-abc-0", 300, 400, inc="u2")], 0.2, ["u1", "u2"], 400),
    ("a row from before incarnations", [row(1, "sw-abc-0", 100, 200, inc=None)], 0.1, ["legacy-1"], 200),
]


@pytest.mark.parametrize(("rows", "usd", "incs", "gone"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_vms_spend_is_the_ledgers_per_incarnation(rows: list[BillingRecord], usd: float, incs: list[str],
                                                     gone: float | None) -> None:
    other = [row(99, "sw-abc-1", 0, 5_000), row(98, "mine", 0, 5_000)]  # other clusters never count
    source = Rows(rows + other)
    got = vm_spend(source, "abc", "v0", 0, NOW)
    assert got.cluster == "sw-abc-0" and abs(got.usd - usd) < 1e-9
    assert [i.incarnation for i in got.incarnations] == incs == incarnations(source, "sw-abc-0")
    assert gone_at(source, "sw-abc-0") == gone
    # The same arithmetic as `cloudtrain cost`: cost.spend over the same rows.
    assert abs(got.usd - spend(rows, until=NOW).usd) < 1e-9


def test_a_sweeps_spend_sums_its_vms() -> None:
    source = Rows([row(1, "sw-abc-0", 100, 110), row(2, "sw-abc-1", 100, 3_700), row(3, "sw-abd-0", 0, 9_000)])
    total = sweep_spend(source, "abc", [("v0", 0), ("v1", 1), ("v2", 2)], NOW)
    assert abs(total.usd - (0.06 + 3.6)) < 1e-9 and not total.billing_now
    assert [v.as_json()["usd"] for v in total.vms] == [0.06, 3.6, 0.0]
