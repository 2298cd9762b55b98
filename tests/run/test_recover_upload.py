"""The on-notice upload script (run/recover_upload.py) run with sh in a node layout on this
machine: it uploads only for the job the notice TERMed, after that job ended, and records how the
copy went in on_notice.json. The copy itself is a stand-in command here (the body the script is
given); the real bucket copy is tested end to end in tests/e2e/test_recovery_e2e.py and
tests/e2e/test_recovery_upload_e2e.py; the laptop's own listing and upload (run/recover_bucket.py)
against each store's fake in tests/run/test_recover_bucket_stores.py."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from cloudtrain.remote.jobs import NodeLayout
from cloudtrain.run import recover_bucket, recover_upload


def _script(tmp_path: Path, job_id: str, body: str) -> tuple[Path, Path]:
    root = tmp_path / "cluster"
    for sub in ("workdir", "runtime", f"jobs/{job_id}"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    node = SimpleNamespace(layout=NodeLayout(str(root)), python=sys.executable)
    text = recover_upload._wrap(node, "s3://b/runs/r1", ["outputs", ".ckpt/r1"], job_id, body)  # type: ignore[arg-type]
    path = root / recover_upload.SCRIPT
    path.write_text(text)
    return root, path


@pytest.mark.parametrize("code", [0, 7])
def test_it_copies_after_the_termed_job_ended_and_records_how_it_went(tmp_path: Path, code: int) -> None:
    root, script = _script(tmp_path, "r1-run", f"cat ../jobs/r1-run/exit_code > copied\nexit {code}\n")
    (root / recover_upload.NOTICE_FILE).write_text(json.dumps({"jobs": ["r1-run"]}))
    (root / "jobs" / "r1-run" / "exit_code").write_text("143\n")
    subprocess.run(["sh", str(script)], check=True, timeout=60)
    assert (root / "workdir" / "copied").read_text() == "143\n"  # it ran in the workdir, after the job's end
    done = json.loads((root / recover_upload.RESULT).read_text())
    assert (done["url"], done["paths"], done["exit_code"]) == ("s3://b/runs/r1", ["outputs", ".ckpt/r1"], code)


def test_a_script_left_by_an_earlier_run_uploads_nothing(tmp_path: Path) -> None:
    root, script = _script(tmp_path, "old-run", "touch copied\n")
    (root / recover_upload.NOTICE_FILE).write_text(json.dumps({"jobs": ["new-run"]}))
    subprocess.run(["sh", str(script)], check=True, timeout=60)
    assert not (root / "workdir" / "copied").exists() and not (root / recover_upload.RESULT).exists()


def test_the_command_that_finishes_an_upload_is_one_shell_line_naming_the_run_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """It carries the store endpoint this CLI was pointed at (an address, never a credential)."""
    for name in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "CLOUDTRAIN_METADATA_URL", "CLOUDTRAIN_BLOB_ENDPOINT",
                 "STORAGE_EMULATOR_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", "http://127.0.0.1:9/a b")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "not-in-the-line")
    run_dir = tmp_path / "runs" / "a run's dir"
    line = recover_bucket.finish_command("gs://b/runs/r1", run_dir, ["outputs", "my results"])
    assert "\n" not in line and "not-in-the-line" not in line
    words = shlex.split(line)
    assert words[:2] == ["CLOUDTRAIN_BUCKET_IDENTITY=configured", "CLOUDTRAIN_GCS_ENDPOINT=http://127.0.0.1:9/a b"]
    assert words[2] == sys.executable and words[3].endswith("bucket_copy.py") and Path(words[3]).is_file()
    assert words[4:] == ["put", "gs://b/runs/r1", "--base", str(run_dir), "outputs", "my results"]


def test_a_run_whose_results_are_nothing_has_nothing_left_to_upload(tmp_path: Path) -> None:
    said: list[str] = []
    done = recover_bucket.put_from_laptop("s3://b/runs/r1", tmp_path, ["outputs"], "aws reports i-1 terminated",
                                          1.0, said.append)
    assert (done.ok, done.paths, done.exit_code, done.finish, said) == (True, (), 0, None, [])
