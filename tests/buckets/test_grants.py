from types import SimpleNamespace

import pytest

from cloudtrain.buckets.grants import grants_for, recipe_grants

pytestmark = pytest.mark.quick


def test_read_on_data_write_on_upload_one_grant_per_url() -> None:
    grants = grants_for(["./local", "s3://data-bkt/train", "s3://data-bkt/train"], "s3://out-bkt/runs")
    assert [(str(g.url), g.write) for g in grants] == [("s3://data-bkt/train", False), ("s3://out-bkt/runs", True)]


def test_upload_to_a_data_prefix_makes_it_writable() -> None:
    grants = grants_for(["s3://bkt-one/x"], "s3://bkt-one/x")
    assert [(str(g.url), g.write) for g in grants] == [("s3://bkt-one/x", True)]


def test_recipe_without_buckets_needs_none() -> None:
    recipe = SimpleNamespace(data=[SimpleNamespace(source="data/")], upload=None)
    assert recipe_grants(recipe) == ()
