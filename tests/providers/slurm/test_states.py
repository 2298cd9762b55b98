"""Slurm's job states: one table for the job state, the exit code and the words."""

from __future__ import annotations

import subprocess

import pytest

from cloudtrain.paths import templates_dir
from cloudtrain.providers.slurm.states import (MEANINGS, SlurmState, describe_pending, exit_code, meaning,
                                               parse_show_job, shell_table)
from cloudtrain.remote.jobs import JobState


@pytest.mark.parametrize("state,job_state,slurm_exit,code", [
    ("PENDING", JobState.PENDING, "0:0", None),
    ("RUNNING", JobState.RUNNING, "0:0", None),
    ("COMPLETING", JobState.RUNNING, "0:0", None),
    ("COMPLETED", JobState.SUCCEEDED, "0:0", 0),
    ("FAILED", JobState.FAILED, "3:0", 3),
    ("FAILED", JobState.FAILED, "0:9", 137),
    ("FAILED", JobState.FAILED, "0:0", 1),
    ("TIMEOUT", JobState.FAILED, "0:15", 124),
    ("CANCELLED", JobState.KILLED, "0:15", 143),
    ("CANCELLED by 0", JobState.KILLED, "0:15", 143),
    ("PREEMPTED", JobState.KILLED, "0:15", 143),
    ("NODE_FAIL", JobState.LOST, "0:0", 1),
    ("OUT_OF_MEMORY", JobState.FAILED, "0:125", 137),
])
def test_each_state_means_one_thing(state: str, job_state: JobState, slurm_exit: str, code: int | None) -> None:
    known = meaning(state)
    assert known is not None and known.job_state is job_state
    if code is not None:
        assert known.terminal and exit_code(state, slurm_exit) == code


def test_every_state_has_a_meaning_and_unknown_ones_are_none() -> None:
    assert set(MEANINGS) == set(SlurmState)
    assert meaning("SOMETHING_NEW") is None and meaning("") is None


def test_the_submit_script_maps_end_states_as_the_table_does(tmp_path) -> None:  # noqa: ANN001
    # The exit-code rule of templates/slurm_submit.sh, run by sh on the table this module generates.
    template = (templates_dir() / "slurm_submit.sh").read_text()
    rule = template[template.index("rule=$("):template.index('echo "$id $state $code"')]
    rule = rule[:rule.index("# Other nodes")]
    for state in (s for s, m in MEANINGS.items() if m.terminal):
        for slurm_exit in ("0:0", "2:0", "0:9"):
            script = f'CT_EXITS="{shell_table()}"; state={state}; slurm_exit={slurm_exit}\n{rule}\necho "$code"\n'
            got = subprocess.run(["sh", "-c", script], capture_output=True, text=True, check=True).stdout.strip()
            assert got == str(exit_code(state, slurm_exit)), (state, slurm_exit)


def test_show_job_and_pending_reasons() -> None:
    line = ("JobId=7 JobName=cloudtrain-x UserId=root(0) JobState=PENDING Reason=Resources Dependency=(null) "
            "ExitCode=0:0 NodeList=(null) Comment=cloudtrain:me:c")
    fields = parse_show_job(line)
    assert (fields["JobState"], fields["Reason"], fields["Comment"]) == ("PENDING", "Resources", "cloudtrain:me:c")
    assert describe_pending("Resources") == "Resources (the nodes it needs are busy)"
    assert describe_pending("SomethingElse") == "SomethingElse"


def test_the_queue_listing_is_data() -> None:
    from cloudtrain.providers.slurm.leaks import parse_queue

    jobs = parse_queue("12|cloudtrain-c-1-run|RUNNING|cloudtrain:me:c\n13|other|PENDING|(null)\n\ngarbage\n")
    assert [(j.id, j.owner_and_cluster, j.cloudtrain_job) for j in jobs] == [
        ("12", ("me", "c"), "c-1-run"), ("13", None, None)]
