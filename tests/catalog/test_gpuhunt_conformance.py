"""Our reading of gpuhunt's format against gpuhunt itself (runs where the gpuhunt package is installed).

If dstack moves the catalog (URL, layout) or changes its columns, these fail on the next gpuhunt
upgrade, before a refresh in the field silently reads nothing: the fake serves what the real
gpuhunt client accepts, and our reader agrees with gpuhunt's on every row.
"""

from __future__ import annotations

import datetime as dt
from pathlib import Path

import pytest

from cloudtrain.catalog import gpuhunt_format as fmt
from tests.catalog.fake_gpuhunt import AWS_ROWS, FIELDS, GCP_ROWS, FakeGpuhunt, to_csv

gpuhunt = pytest.importorskip("gpuhunt")
storage = pytest.importorskip("gpuhunt._internal.storage")
internal = pytest.importorskip("gpuhunt._internal.catalog")


def test_the_published_location_and_columns_are_the_ones_we_read() -> None:
    assert internal.CATALOG_URL == fmt.DEFAULT_URL
    assert storage.CATALOG_V2_FIELDS == FIELDS
    assert set(fmt.REQUIRED) <= set(FIELDS)
    assert {"aws", "gcp", "azure"} <= set(internal.OFFLINE_PROVIDERS)


def test_gpuhunt_reads_the_fake_over_http_as_we_do(gpuhunt_server: FakeGpuhunt, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(fmt.URL_ENV, gpuhunt_server.base)
    catalog = gpuhunt.Catalog(balance_resources=False, auto_reload=False)
    catalog.load()  # asks for every provider it knows; the fake has three (the rest get 404s, logged)
    ours = fmt.convert("aws", to_csv(AWS_ROWS), dt.date(2026, 11, 20))
    theirs = catalog.query(provider="aws", cpu_arch="x86")
    usable = [i for i in theirs if i.gpu_count == 0 or i.gpu_vendor == gpuhunt.AcceleratorVendor.NVIDIA]
    on_demand = {(i.location, i.instance_name): i for i in usable if not i.spot}
    spot = {(i.location, i.instance_name): i.price for i in usable if i.spot}
    expected = {(k, i.price, spot.get(k), i.cpu, i.memory, i.gpu_name if i.gpu_count else None, i.gpu_count,
                 i.gpu_memory if i.gpu_count else None) for k, i in on_demand.items()}
    got = {((o.region, o.instance_type), o.price, o.spot_price, o.vcpus, o.memory_gib, o.accelerator,
            o.accelerator_count, o.gpu_memory_gib) for o in ours.offers}
    assert got == expected


def test_gpuhunt_catalog_dir_layout_is_the_one_we_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "gcp.csv").write_text(to_csv(GCP_ROWS))
    monkeypatch.setenv(fmt.DIR_ENV, str(tmp_path))
    items = gpuhunt.Catalog(balance_resources=False, auto_reload=False).query(provider="gcp")
    assert len(items) == len(GCP_ROWS)  # gpuhunt reads every row of {dir}/gcp.csv
    ours = fmt.convert("gcp", (tmp_path / "gcp.csv").read_text(), None)
    assert ours.rows == len(items)
