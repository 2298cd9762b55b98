"""A job's output is data: whatever it prints, `run` and `logs` show it as text (issue 29, case 4)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from tests.conftest import cloudtrain

# One progress-looking line nested 200,000 levels deep (json's decoder gives up near 1,000 levels:
# RecursionError, which ended `cloudtrain run` with "internal error" after a successful job), a
# progress line whose fields the display cannot use, and 3 MiB without a newline.
JOB = """\
python3 -c 'print("{\\"cloudtrain\\": \\"progress\\", \\"x\\": " + "[" * 200000 + "]" * 200000 + "}")'
echo '{"cloudtrain": "progress", "type": "start", "epochs": "many", "steps_per_epoch": 1e400}'
python3 -c 'import sys; sys.stdout.write("y" * (3 << 20)); sys.stdout.write("\\n")'
echo job finished
"""


def test_hostile_output_is_shown_as_text_by_run_and_logs(tmp_path: Path) -> None:
    recipe = tmp_path / "loud.yaml"
    recipe.write_text("name: loud\nrun: |\n" + textwrap.indent(JOB, "  "))
    proc = cloudtrain("run", str(recipe), "--keep", "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:] + proc.stdout[-2000:]
    assert "internal error" not in proc.stderr
    assert '"x": [[[[' in proc.stdout and '"epochs": "many"' in proc.stdout and "job finished" in proc.stdout
    run_dir = Path(proc.stdout.strip().splitlines()[-1])
    assert json.loads((run_dir / "run.json").read_text())["status"] == "succeeded"
    logs = cloudtrain("logs", "loud")
    assert logs.returncode == 0 and "internal error" not in logs.stderr, logs.stderr[-2000:]
    assert '"x": [[[[' in logs.stdout and "y" * 1000 in logs.stdout and "job finished" in logs.stdout
    down = cloudtrain("down", "loud")
    assert down.returncode == 0, down.stderr
