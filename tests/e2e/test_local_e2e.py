"""The local provider end to end, driving `cloudtrain` as a subprocess like a user would."""

from __future__ import annotations

import json
import os
import re
import signal
import textwrap
from pathlib import Path

import pytest

from cloudtrain.testing.wait import wait_until
from tests.conftest import REPO, cloudtrain, start_cli


def write_recipe(tmp_path: Path, body: str, name: str = "recipe.yaml") -> Path:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return path


def test_run_shell_job_collects_results(tmp_path: Path) -> None:
    work = tmp_path / "code"
    work.mkdir()
    (work / "train.sh").write_text("mkdir -p outputs && echo \"$GREETING\" > outputs/greeting.txt\n")
    (work / "ignored.log").write_text("secret\n")
    (work / ".cloudtrainignore").write_text("*.log\n")
    recipe = write_recipe(tmp_path, """\
        name: shell-job
        workdir: code
        envs: {GREETING: "hello 'world' $(not run); ok"}
        setup: echo setting up
        run: |
          sh train.sh
          ls
          echo "rank $CLOUDTRAIN_NODE_RANK of $CLOUDTRAIN_NUM_NODES"
        results: [outputs]
    """)
    proc = cloudtrain("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert run_dir.parent == tmp_path / "runs"
    assert (run_dir / "outputs" / "greeting.txt").read_text() == "hello 'world' $(not run); ok\n"
    log = (run_dir / "job.log").read_text()
    assert "rank 0 of 1" in log
    assert "ignored.log" not in log and "train.sh" in log
    assert "setting up" in (run_dir / "setup.log").read_text()
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and record["exit_code"] == 0
    assert record["provider"] == "local" and record["hourly_price_usd"] == 0 and record["cost_usd"] == 0
    assert set(record["phases_s"]) >= {"provision", "sync", "setup", "run", "collect", "teardown"}
    assert record["teardown"] == "down"
    assert len(record["recipe"]["digest"]) == 64
    assert "GREETING" not in (run_dir / "run.json").read_text()  # envs may be secrets
    status = cloudtrain("status", "--json")
    data = json.loads(status.stdout)
    assert data["clusters"] == []  # torn down
    gone = cloudtrain("logs", "shell-job")  # the cluster is down: its run's collected log
    assert gone.returncode == 0 and gone.stdout == (run_dir / "job.log").read_text(), gone.stderr
    assert data["runs"][0]["status"] == "succeeded"


def test_failing_job_collects_logs_and_exits_nonzero(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, """\
        name: will-fail
        run: |
          mkdir -p outputs; echo partial > outputs/partial.txt
          echo "about to fail" >&2
          exit 7
        results: [outputs]
    """)
    proc = cloudtrain("run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 7, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert (run_dir / "outputs" / "partial.txt").read_text() == "partial\n"
    assert "about to fail" in (run_dir / "job.log").read_text()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    status = cloudtrain("status")
    assert "will-fail" in status.stdout and "failed (7)" in status.stdout
    down = cloudtrain("down", "will-fail")
    assert down.returncode == 0
    again = cloudtrain("down", "will-fail")  # idempotent
    assert again.returncode == 0 and "already down" in again.stdout


def _wait_for(predicate, timeout: float = 60.0, what: str = "condition") -> None:  # noqa: ANN001
    wait_until(predicate, timeout, what)


def test_sigint_during_run_tears_down(tmp_path: Path, cloudtrain_home: Path) -> None:
    marker = tmp_path / "job-started"
    recipe = write_recipe(tmp_path, f"""\
        name: interrupted
        run: |
          echo $$ > {marker}
          sleep 600
    """)
    proc = start_cli("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    _wait_for(lambda: marker.exists() and marker.read_text().strip(), what="job start")
    job_pid = int(marker.read_text())
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, out + err
    _wait_for(lambda: not _alive(job_pid), timeout=15, what="job process to exit")
    data = json.loads(cloudtrain("status", "--json").stdout)
    assert data["clusters"] == []
    assert data["runs"][0]["status"] == "interrupted"
    assert not list((cloudtrain_home / "local").glob("*")), "local node directory left behind"
    run_dir = next((tmp_path / "runs").iterdir())
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie waiting for its parent counts as gone.
    try:
        return "Z" not in Path(f"/proc/{pid}/stat").read_text().split()[2]
    except FileNotFoundError:
        return False


def test_logs_follow_interrupted_and_resumed(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "name: logbox\nrun: 'true'\n")
    assert cloudtrain("up", str(recipe)).returncode == 0
    started = cloudtrain("exec", "logbox", "--detach", "--",
                         "for i in $(seq 1 60); do echo line-$i; sleep 0.05; done")
    assert started.returncode == 0, started.stderr
    first = start_cli("logs", "logbox", "-f", "--resume")
    got: list[str] = []
    assert first.stdout is not None
    while len(got) < 5:
        got.append(first.stdout.readline().rstrip("\n"))
    first.send_signal(signal.SIGINT)
    # Read through the same buffered pipe object: communicate() would skip what readline buffered.
    got += [line for line in first.stdout.read().splitlines() if line]
    first.wait(timeout=30)
    assert first.returncode == 130
    assert first.stderr is not None
    said = first.stderr.read()
    # What stopped (the printing, not the job) and how to go on; no bare "Aborted.".
    assert "the job runs on" in said and "cloudtrain logs logbox -f --resume" in said and "Aborted." not in said
    second = cloudtrain("logs", "logbox", "-f", "--resume")
    assert second.returncode == 0, second.stderr
    got += second.stdout.splitlines()
    assert got == [f"line-{i}" for i in range(1, 61)]
    full = cloudtrain("logs", "logbox")
    assert full.stdout.splitlines() == [f"line-{i}" for i in range(1, 61)]
    assert cloudtrain("down", "logbox").returncode == 0


def test_exec_on_kept_cluster_and_stop_start(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, "name: box\nrun: echo first\n")
    assert cloudtrain("run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs")).returncode == 0
    out = cloudtrain("exec", "box", "--", "echo", "it's $(here)")
    assert out.returncode == 0 and "it's $(here)" in out.stdout
    failing = cloudtrain("exec", "box", "--", "sh", "-c", "exit 4")
    assert failing.returncode == 4
    assert cloudtrain("stop", "box").returncode == 0
    assert "stopped" in cloudtrain("status", "box").stdout
    refused = cloudtrain("exec", "box", "--", "true")
    assert refused.returncode == 2 and "cloudtrain start box" in refused.stderr
    assert cloudtrain("start", "box").returncode == 0
    assert cloudtrain("exec", "box", "--", "true").returncode == 0
    assert cloudtrain("down", "box").returncode == 0


@pytest.mark.parametrize(
    "args,expected",
    [
        (["run", "missing.yaml"], "file not found"),
        (["validate", "bad.yaml"], "resources.cloud"),
        (["logs", "no-such-cluster"], "no cluster named"),
        (["run", "unavailable.yaml"], "budget.max_usd needs a priced cloud: cloud local has no hourly price"),
        (["run", "later-cloud.yaml"], "no GCP credentials found"),
    ],
)
def test_bad_input_is_one_line_exit_2(tmp_path: Path, args: list[str], expected: str) -> None:
    (tmp_path / "bad.yaml").write_text("name: x\nrun: y\nresources: {cloud: nope}\n")
    (tmp_path / "unavailable.yaml").write_text("name: x\nrun: y\nbudget: {max_usd: 5}\n")
    (tmp_path / "later-cloud.yaml").write_text("name: x\nrun: y\nresources: {cloud: gcp}\n")
    proc = cloudtrain(*args, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and expected in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_validate_and_schema(tmp_path: Path) -> None:
    ok = cloudtrain("validate", str(REPO / "recipes" / "mnist-local.yaml"))
    assert ok.returncode == 0 and "ok" in ok.stdout
    schema = json.loads(cloudtrain("schema").stdout)
    assert "resources" in schema["properties"]


def test_bundled_mnist_recipe_end_to_end(tmp_path: Path) -> None:
    """The README's first command, shortened to one epoch: metrics, run.json and the log come home."""
    recipe = (REPO / "recipes" / "mnist-local.yaml").read_text().replace("epochs: 10", "epochs: 1")
    assert "epochs: 1" in recipe
    path = tmp_path / "mnist-local.yaml"
    path.write_text(recipe)
    proc = cloudtrain("run", str(path), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    metrics = json.loads((run_dir / "outputs" / "metrics.json").read_text())
    assert metrics["epochs"] == 1 and metrics["device"] == "CPU" and metrics["data_source"] == "bundled"
    assert 0.5 < metrics["test_accuracy"] <= 1.0
    assert (run_dir / "outputs" / "device_placement.json").is_file()
    assert "epoch 1/1" in proc.stdout  # progress lines rendered by the CLI
    record = json.loads((run_dir / "run.json").read_text())
    assert record["status"] == "succeeded" and "outputs/metrics.json" in record["results"]
    # What the user reads (14.2, 14.3): readable lines, one per fact, no protocol, no native noise;
    # the machine stream and TensorFlow's own log come home as files of their own.
    log = (run_dir / "job.log").read_text()
    for text in (log, proc.stdout, proc.stderr):
        assert '"cloudtrain"' not in text and "cuInit" not in text and "absl::" not in text, text[-3000:]
        assert not re.search(r"^[IWEF]\d{4} ", text, re.MULTILINE), text[-3000:]
    assert sum(line.startswith("test accuracy") for line in proc.stdout.splitlines()) == 1
    assert sum(line.startswith("test accuracy") for line in log.splitlines()) == 1
    epoch_line = next(line for line in log.splitlines() if line.startswith("epoch 1/1"))
    assert epoch_line in proc.stdout  # `run` and job.log show the same line
    logs = cloudtrain("logs", "mnist-local")  # the cluster is down: the collected log, as it is
    assert logs.returncode == 0 and logs.stdout == log
    events = [json.loads(line) for line in (run_dir / "outputs" / "progress.jsonl").read_text().splitlines()]
    kinds = [e["type"] for e in events]
    assert kinds[0] == "start" and kinds[-2:] == ["epoch", "done"]
    assert (run_dir / "outputs" / "tensorflow.log").is_file()


def test_multi_node_ranks_and_one_node_failure(tmp_path: Path) -> None:
    recipe = write_recipe(tmp_path, """\
        name: pair
        num_nodes: 2
        run: |
          echo "rank=$CLOUDTRAIN_NODE_RANK nodes=$CLOUDTRAIN_NUM_NODES ips=$CLOUDTRAIN_NODE_IPS"
          if [ "$CLOUDTRAIN_NODE_RANK" = 1 ] && [ -n "$FAIL_RANK_1" ]; then exit 5; fi
          if [ "$CLOUDTRAIN_NODE_RANK" = 0 ] && [ -n "$FAIL_RANK_1" ]; then sleep 600; fi
    """)
    ok = cloudtrain("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    run_dir = Path(ok.stdout.strip().splitlines()[-1])
    assert "rank=0 nodes=2 ips=127.0.0.1,127.0.0.1" in (run_dir / "job.log").read_text()
    assert "rank=1 nodes=2" in (run_dir / "node-1-job.log").read_text()

    (tmp_path / "fail.yaml").write_text(recipe.read_text().replace("name: pair", "name: pair-fail\nenvs: {FAIL_RANK_1: 'yes'}"))
    # Rank 0 sleeps 600 s: that `run` ends at all (within the 300 s bound on a hung test) shows rank 0
    # was stopped when rank 1 failed; no bound on elapsed time, which a loaded machine stretches.
    bad = cloudtrain("run", "fail.yaml", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path, timeout=300)
    assert bad.returncode == 5, bad.stdout + bad.stderr
    assert "node 1 failed (exit code 5)" in bad.stdout


def test_up_syncs_and_exec_syncs_changes_first(tmp_path: Path) -> None:
    """`exec` after `up` sees the workdir, and an edit made since (issue 14.7)."""
    work = tmp_path / "code"
    work.mkdir()
    (work / "a.txt").write_text("first\n")
    recipe = write_recipe(tmp_path, "name: synced\nworkdir: code\nenvs: {GREETING: hi}\nrun: 'true'\n")
    assert cloudtrain("up", str(recipe), cwd=tmp_path).returncode == 0
    seen = cloudtrain("exec", "synced", "--", "sh", "-c", "cat a.txt; echo $GREETING")
    assert seen.returncode == 0 and "first" in seen.stdout and "hi" in seen.stdout, seen.stderr
    (work / "a.txt").write_text("edited\n")
    again = cloudtrain("exec", "synced", "--", "cat", "a.txt")
    assert again.returncode == 0 and "edited" in again.stdout, again.stderr
    assert cloudtrain("down", "synced").returncode == 0


def test_run_on_a_stopped_cluster_leaves_it_stopped(tmp_path: Path) -> None:
    """A run puts a cluster back the way it found it (issue 14.14)."""
    recipe = write_recipe(tmp_path, "name: sleeper\nrun: echo ran\n")
    assert cloudtrain("up", str(recipe)).returncode == 0
    assert cloudtrain("stop", "sleeper").returncode == 0
    proc = cloudtrain("run", str(recipe), "--runs-dir", str(tmp_path / "runs"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert json.loads((run_dir / "run.json").read_text())["teardown"] == "stopped"
    data = json.loads(cloudtrain("status", "--json").stdout)
    assert [c["status"] for c in data["clusters"]] == ["stopped"]
    assert cloudtrain("down", "sleeper").returncode == 0


def test_exec_on_a_cluster_whose_nodes_are_gone_suggests_what_works(tmp_path: Path, cloudtrain_home: Path) -> None:
    """Not `cloudtrain start` (which would fail too) but down, then up (issue 14.15)."""
    import shutil

    recipe = write_recipe(tmp_path, "name: vanished\nrun: 'true'\n")
    assert cloudtrain("up", str(recipe)).returncode == 0
    shutil.rmtree(cloudtrain_home / "local" / "local-vanished-0")  # the machine went away
    assert cloudtrain("status", "--refresh").returncode == 0
    proc = cloudtrain("exec", "vanished", "--", "true")
    assert proc.returncode == 2 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "cloudtrain down vanished" in proc.stderr and "cloudtrain start" not in proc.stderr
    assert cloudtrain("down", "vanished").returncode == 0


# ---------------------------------------------------------------- the first hour (issue 14)

def test_quiet_run_prints_only_the_summary_and_the_run_directory(tmp_path: Path) -> None:
    """`run -q` (14.4): no phase lines, no job output, no progress; the summary and the run dir."""
    recipe = write_recipe(tmp_path, """\
        name: hush
        setup: echo setting-up
        run: |
          echo job-output
          echo '{"cloudtrain":"progress","type":"epoch","epoch":1,"epochs":1,"loss":0.5}'
          echo '{"cloudtrain":"progress","type":"done","test_accuracy":0.9}'
    """)
    proc = cloudtrain("run", str(recipe), "-q", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    for noise in ("==>", "<==", "setting-up", "job-output", "epoch 1/1", "test accuracy", "workdir:"):
        assert noise not in out, f"{noise!r} in quiet output:\n{out}"
    assert "status" in out and "succeeded" in out
    run_dir = Path(out.strip().splitlines()[-1])
    assert run_dir.parent == tmp_path / "runs" and (run_dir / "job.log").is_file()
    assert proc.stderr == ""
    loud = cloudtrain("run", str(recipe), "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert "==> run" in loud.stdout and "job-output" in loud.stdout and "epoch 1/1  loss 0.5000" in loud.stdout


@pytest.mark.parametrize("quiet", [False, True], ids=["normal", "quiet"])
def test_a_failed_run_prints_the_tail_of_its_log(tmp_path: Path, quiet: bool) -> None:
    """Every failed run ends with the last lines of the log that explains it (14.4)."""
    recipe = write_recipe(tmp_path, """\
        name: tail-end
        run: |
          for i in $(seq 1 40); do echo "line-$i"; done
          echo "Traceback: it broke" >&2
          exit 3
    """)
    args = ["run", str(recipe), "--runs-dir", str(tmp_path / "runs")] + (["-q"] if quiet else [])
    proc = cloudtrain(*args, cwd=tmp_path)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    lines = proc.stdout.splitlines()
    run_dir = Path(lines[-1])
    header = next(i for i, line in enumerate(lines) if line.startswith("last 20 of 41 lines of"))
    assert lines[header].endswith(f"{run_dir / 'job.log'}:")
    assert [line.strip() for line in lines[header + 1:header + 21]] == [f"line-{i}" for i in range(22, 41)] + [
        "Traceback: it broke"]
    if quiet:
        assert "line-5" not in proc.stdout  # the log was not streamed, only its tail shown
    setup_fails = write_recipe(tmp_path, "name: bad-setup\nsetup: echo no-pip; exit 4\nrun: echo never\n", "s.yaml")
    proc = cloudtrain("run", str(setup_fails), "-q", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 4 and "setup.log:" in proc.stdout and "  no-pip" in proc.stdout, proc.stdout


def test_env_overrides_the_recipe_on_run_and_exec(tmp_path: Path) -> None:
    """`--env KEY=VALUE`, repeatable, over the recipe's envs (14.8); never written to run.json or state."""
    recipe = write_recipe(tmp_path, """\
        name: envy
        envs: {LR: "0.1", KEEP: kept}
        setup: echo "setup sees LR=$LR"
        run: echo "LR=$LR KEEP=$KEEP EXTRA=$EXTRA"
    """)
    proc = cloudtrain("run", str(recipe), "--env", "LR=0.001", "-e", "EXTRA=a=b c", "--keep",
                      "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert "LR=0.001 KEEP=kept EXTRA=a=b c" in (run_dir / "job.log").read_text()
    assert "setup sees LR=0.001" in (run_dir / "setup.log").read_text()
    assert "a=b c" not in (run_dir / "run.json").read_text()
    assert "a=b c" not in cloudtrain("status", "--json").stdout
    out = cloudtrain("exec", "envy", "--env", "LR=0.5", "--", "sh", "-c", 'echo "exec LR=$LR KEEP=$KEEP"')
    assert out.returncode == 0 and "exec LR=0.5 KEEP=kept" in out.stdout, out.stdout + out.stderr
    for bad in ("NOVALUE", "1X=2", "=x"):
        refused = cloudtrain("run", str(recipe), "--env", bad, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1 and "KEY=VALUE" in refused.stderr
    assert cloudtrain("down", "envy").returncode == 0


def test_recipe_path_is_stored_absolute(tmp_path: Path) -> None:
    """run.json, the run row and the cluster row name the recipe wherever the command ran (14.13)."""
    write_recipe(tmp_path, "name: where\nrun: echo hi\n", "where.yaml")
    proc = cloudtrain("run", "where.yaml", "--keep", "--runs-dir", "runs", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    expected = str((tmp_path / "where.yaml").resolve())
    assert run_dir.is_absolute() and run_dir.parent == (tmp_path / "runs").resolve()
    assert json.loads((run_dir / "run.json").read_text())["recipe"]["path"] == expected
    data = json.loads(cloudtrain("status", "--json").stdout)
    assert data["runs"][0]["recipe_path"] == expected
    assert data["clusters"][0]["recipe_path"] == expected
    assert cloudtrain("down", "where").returncode == 0


def test_logs_render_progress_lines_like_run(tmp_path: Path) -> None:
    """`logs` shows readable lines, never the raw progress protocol (14.3), live and after teardown."""
    recipe = write_recipe(tmp_path, """\
        name: readable
        run: |
          echo start-of-job
          echo '{"cloudtrain":"progress","type":"step","epoch":1,"epochs":2,"step":5,"steps_per_epoch":5,"loss":1}'
          echo '{"cloudtrain":"progress","type":"epoch","epoch":1,"epochs":2,"loss":0.5,"epoch_time_s":1.25}'
    """)
    proc = cloudtrain("run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expected = ["start-of-job", "epoch 1/2  loss 0.5000  1.2s"]
    live = cloudtrain("logs", "readable")
    assert live.returncode == 0 and live.stdout.splitlines() == expected, live.stdout + live.stderr
    assert cloudtrain("down", "readable").returncode == 0
    collected = cloudtrain("logs", "readable")
    assert collected.returncode == 0 and collected.stdout.splitlines() == expected, collected.stdout


def test_bad_recipe_errors_name_file_and_line_for_every_problem(tmp_path: Path) -> None:
    """Up to five problems, each with file:line; ${VAR} and not-available errors too (14.10)."""
    (tmp_path / "many.yaml").write_text("name: x\nrun: y\nnum_nodes: 1.5\nresources: {cpus: -1, clod: aws}\nsetpu: z\n")
    proc = cloudtrain("validate", "many.yaml", cwd=tmp_path)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert lines == [
        "error: many.yaml:3: num_nodes: input should be a valid integer, got a number with a fractional part (1.5)",
        "error: many.yaml:4: resources.cpus: input should be greater than or equal to 1, got -1",
        "error: many.yaml:4: resources.clod: unknown key 'clod'; did you mean 'cloud'?",
        "error: many.yaml:5: setpu: unknown key 'setpu'; did you mean 'setup'?",
    ], proc.stderr
    (tmp_path / "var.yaml").write_text("name: x\nrun: y\nenvs:\n  TOKEN: '${CT_E2E_UNSET_VAR}'\n")
    proc = cloudtrain("run", "var.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: var.yaml:4: envs.TOKEN: ${CT_E2E_UNSET_VAR}"), proc.stderr
    (tmp_path / "na.yaml").write_text("name: x\nrun: y\n\nbudget: {max_usd: 5}\n")
    proc = cloudtrain("run", "na.yaml", cwd=tmp_path)
    assert proc.returncode == 2 and proc.stderr.startswith("error: na.yaml:4: budget.max_usd"), proc.stderr
