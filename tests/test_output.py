"""What the terminal shows: tables, the run display in normal and quiet mode, progress rendered as text."""

from __future__ import annotations

import pytest

from cloudtrain.cli import output

pytestmark = pytest.mark.quick


def test_summary_table_without_headers_has_no_empty_header_row(capsys: pytest.CaptureFixture[str],
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    output.table(["", ""], [("run", "r-1"), ("status", "succeeded")])
    plain = capsys.readouterr().out.splitlines()
    assert plain == ["run     r-1", "status  succeeded"]
    monkeypatch.setattr(output, "is_tty", lambda: True)
    output.table(["", ""], [("run", "r-1"), ("status", "succeeded")])
    boxed = capsys.readouterr().out.splitlines()
    assert any("r-1" in line for line in boxed)
    # No row made only of borders and blanks between the top border and the first value.
    first_value = next(i for i, line in enumerate(boxed) if "r-1" in line)
    assert first_value == 1, boxed
    output.table(["CLUSTER", "CLOUD"], [("a", "local")])
    assert "CLUSTER" in capsys.readouterr().out


def test_progress_text_is_one_readable_line_per_fact() -> None:
    epoch = {"cloudtrain": "progress", "type": "epoch", "epoch": 2, "epochs": 10, "loss": 0.25, "accuracy": 0.9,
             "val_loss": 0.3, "val_accuracy": 0.88, "epoch_time_s": 1.25}
    assert output.progress_text(epoch) == \
        "epoch 2/10  loss 0.2500  accuracy 0.9000  val_loss 0.3000  val_accuracy 0.8800  1.2s"
    assert output.progress_text({"type": "done", "test_accuracy": 0.98123}) == "test accuracy 0.9812"
    assert output.progress_text({"type": "step", "epoch": 1, "step": 20}) is None  # steps only drive the bar
    assert output.render_log_line('{"cloudtrain":"progress","type":"epoch","epoch":1,"epochs":1,"loss":1}') == \
        "epoch 1/1  loss 1.0000"
    assert output.render_log_line('{"cloudtrain":"progress","type":"step","epoch":1,"step":5}') is None
    assert output.render_log_line("plain text") == "plain text"


def test_quiet_display_shows_only_failures(capsys: pytest.CaptureFixture[str]) -> None:
    display = output.RunDisplay(quiet=True)
    display.phase_start("run")
    display.log_line("job output")
    display.progress({"type": "epoch", "epoch": 1, "epochs": 2, "loss": 0.5})
    display.progress({"type": "done", "test_accuracy": 0.9})
    display.info("workdir: sent 3 of 3 files")
    display.phase_end("run", 1.0)
    assert capsys.readouterr() == ("", "")
    display.phase_end("run", 1.0, ok=False)
    display.warn("collect failed")
    got = capsys.readouterr()
    assert "run FAILED" in got.out and "warning: collect failed" in got.err


def test_normal_display_shows_phases_logs_and_epochs(capsys: pytest.CaptureFixture[str]) -> None:
    display = output.RunDisplay()
    display.phase_start("run")
    display.log_line("job output")
    display.progress({"type": "epoch", "epoch": 1, "epochs": 2, "loss": 0.5})
    display.phase_end("run", 1.0)
    out = capsys.readouterr().out.splitlines()
    assert out == ["==> run", "job output", "epoch 1/2  loss 0.5000", "<== run ok (1.0s)"]


def test_the_bundled_job_prints_the_lines_the_cli_renders() -> None:
    """`logs` of an older job.log (protocol lines) and the job's own readable lines must read the same."""
    import importlib.util
    import sys
    from pathlib import Path

    job_file = Path(__file__).resolve().parents[1] / "cloudtrain" / "jobs" / "mnist_cnn.py"
    spec = importlib.util.spec_from_file_location("mnist_cnn_for_output_test", job_file)
    assert spec and spec.loader
    job = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = job
    spec.loader.exec_module(job)
    events = [
        {"type": "start", "epochs": 2, "steps_per_epoch": 5, "initial_epoch": 0},
        {"type": "step", "epoch": 1, "epochs": 2, "step": 5, "steps_per_epoch": 5, "loss": 1.0},
        {"type": "epoch", "epoch": 1, "epochs": 2, "loss": 0.5, "accuracy": 0.8, "val_loss": 0.4, "val_accuracy": 0.85,
         "epoch_time_s": 2.345},
        {"type": "done", "test_accuracy": 0.98, "test_loss": 0.07, "images_per_sec": 3210.5},
        {"type": "done", "test_accuracy": 0.98},
    ]
    for event in events:
        assert job.progress_text(event) == output.progress_text(event), event
    assert output.progress_text(events[3]) == "test accuracy 0.9800  loss 0.0700  3,210 images/s (steady state)"


def test_a_plain_table_is_its_title_and_aligned_lines(capsys: pytest.CaptureFixture[str]) -> None:
    output.table(["NAME", "COST"], [("a", "$1.00"), ("longer", None)], title="spend")
    assert capsys.readouterr().out == "spend\nNAME    COST\na       $1.00\nlonger  -\n"
    output.table(["NAME"], [])
    assert capsys.readouterr().out == "NAME\n"
    output.table(["", ""], [])
    assert capsys.readouterr().out == ""
