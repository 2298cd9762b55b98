"""Which Storage Blob Data role the cluster's managed identity gets on which container (azure/storage.py)."""

from __future__ import annotations

from cloudtrain.buckets.grants import grants_for
from cloudtrain.providers.azure.storage import (
    CONTRIBUTOR_ROLE,
    READER_ROLE,
    _DESCRIPTION,
    assignment_name,
    container_roles,
    description,
)


def test_reader_on_data_containers_contributor_on_the_upload_container_other_stores_ignored() -> None:
    grants = grants_for(["az://acct01/data/train", "az://acct01/data/val", "az://acct02/shared/x", "s3://bkt/x",
                         "./local"], "az://acct01/out/runs")
    assert container_roles(grants) == {("acct01", "data"): READER_ROLE, ("acct02", "shared"): READER_ROLE,
                                       ("acct01", "out"): CONTRIBUTOR_ROLE}


def test_a_container_both_read_and_written_gets_one_contributor_assignment() -> None:
    # Contributor's dataActions include read: one assignment, whichever grant comes first.
    assert container_roles(grants_for(["az://acct01/box/in"], "az://acct01/box/out")) == {
        ("acct01", "box"): CONTRIBUTOR_ROLE}


def test_assignment_names_are_stable_guids_and_descriptions_name_cluster_and_owner() -> None:
    scope = "/subscriptions/s/resourceGroups/g/providers/Microsoft.Storage/storageAccounts/a/blobServices/default/" \
            "containers/c"
    first = assignment_name("mnist", "p1", scope, READER_ROLE)
    assert first == assignment_name("mnist", "p1", scope.upper(), READER_ROLE)  # ARM ids are case-insensitive
    assert len({first, assignment_name("mnist", "p2", scope, READER_ROLE),
                assignment_name("mnist", "p1", scope, CONTRIBUTOR_ROLE)}) == 3
    found = _DESCRIPTION.match(description("mnist-2", "alice"))
    assert found is not None and (found["cluster"], found["owner"]) == ("mnist-2", "alice")
