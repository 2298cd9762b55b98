"""TensorBoard scalars read without TensorFlow (cloudtrain/tbscalars.py), checked against event
files that TensorFlow itself writes: TF2 scalar tensors of several dtypes, TF1-style simple_value,
Keras' train/validation layout, and files cut short or not event files at all."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cloudtrain.compare_any import load_all, table
from cloudtrain.testing.once import once_per_session
from cloudtrain.tbscalars import final_scalars, read_event_file

from tests.lazy import Lazy, requires

# The [tf] extra; the test suite's setup installs it. Imported only by the one subprocess that
# writes every event file these tests read (written_by_tensorflow).
pytestmark = requires("tensorflow")
tf = Lazy("tensorflow")
ROOT = Path(__file__).resolve().parents[1]


def _write(logdir: Path, points: list[tuple[str, int, float, str]]) -> None:
    """(tag, step, value, kind) with kind one of float32, float64, int64 (TF2 tensors with the
    scalars plugin's metadata, as tf.summary.scalar writes) or simple (a TF1 Summary.Value)."""
    from tensorflow.core.framework import summary_pb2

    meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"))
    writer = tf.summary.create_file_writer(str(logdir))
    with writer.as_default():
        for tag, step, value, kind in points:
            if kind == "simple":
                proto = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag, simple_value=value)])
                tf.summary.experimental.write_raw_pb(proto.SerializeToString(), step=step)
            else:
                tensor = tf.constant(value, dtype={"float32": tf.float32, "float64": tf.float64,
                                                   "int64": tf.int64}[kind])
                tf.summary.write(tag, tensor, step=step, metadata=meta)
    writer.close()


CASES = [
    ("float32", [0.5, 0.25, 0.125], 0.125),
    ("float64", [1.5, 2.5, 3.25], 3.25),
    ("int64", [3, 7, 11], 11.0),
    ("simple", [0.9, 0.95, 0.975], pytest.approx(0.975, rel=1e-6)),
]

# Every event file the tests below read: name -> [(directory under it, points)]. TensorFlow writes
# them all once per run, in one subprocess: importing it into each test worker cost ~4 s of CPU
# and ~1 GB of memory per worker.
FILES: dict[str, list[tuple[str, list[tuple[str, int, float, str]]]]] = {
    **{f"last-{kind}": [("tb", [("loss", step, value, kind) for step, value in enumerate(values)])]
       for kind, values, _ in CASES},
    "keras": [("logs/train", [("epoch_loss", 2, 0.3, "float32"), ("epoch_loss", 1, 0.6, "float32")]),
              ("logs/validation", [("epoch_loss", 1, 0.7, "float32"), ("epoch_loss", 2, 0.4, "float32")])],
    "cut-short": [("tb", [("acc", step, step / 10, "float32") for step in range(5)])],
    **{f"run-{name}": [("outputs/tb", [("accuracy", 0, acc / 2, "float32"), ("accuracy", 1, acc, "float32")])]
       for name, acc in (("a", 0.8), ("b", 0.9))},
    "only": [(".", [("x", 0, 1.0, "float32")])],
}


def _write_all(root: str) -> None:
    """In the writing subprocess: every file of FILES under ROOT/<name>/<directory>."""
    for name, files in FILES.items():
        for where, points in files:
            _write(Path(root) / name / where, points)


def written_by_tensorflow(factory: pytest.TempPathFactory, name: str, dest: Path) -> Path:
    """A copy at DEST of FILES[name] as TensorFlow wrote it (tests may change their copy)."""

    def build(base: Path) -> None:
        res = subprocess.run([sys.executable, "-c", "import sys; from tests.test_tbscalars import _write_all; "
                              "_write_all(sys.argv[1])", str(base)], cwd=ROOT, capture_output=True, text=True,
                             timeout=300, check=False)
        assert res.returncode == 0, res.stderr[-3000:]

    shutil.copytree(once_per_session(factory, "tensorflow-events", build) / name, dest)
    return dest


@pytest.mark.parametrize(("kind", "values", "expected"), CASES)
def test_the_last_step_of_each_tag_is_read_as_tensorflow_wrote_it(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory,
                                                                 kind: str, values: list, expected: float) -> None:
    written_by_tensorflow(tmp_path_factory, f"last-{kind}", tmp_path / "run")
    scalars = read_event_file(next((tmp_path / "run" / "tb").iterdir()))
    assert [s.step for s in scalars] == [0, 1, 2]
    assert [s.value for s in scalars] == pytest.approx(values, rel=1e-6)
    assert final_scalars(tmp_path / "run") == {"tb:tb/loss": expected}


def test_keras_layout_keeps_train_and_validation_apart_and_steps_decide_not_file_order(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = written_by_tensorflow(tmp_path_factory, "keras", tmp_path / "run")
    got = final_scalars(run)
    assert got == {"tb:logs/train/epoch_loss": pytest.approx(0.3), "tb:logs/validation/epoch_loss": pytest.approx(0.4)}


def test_a_file_cut_short_keeps_what_came_before_and_garbage_gives_nothing(
        tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    run = written_by_tensorflow(tmp_path_factory, "cut-short", tmp_path / "run")
    path = next((run / "tb").iterdir())
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the last record is incomplete, as in a file still being written
    assert [s.step for s in read_event_file(path)] == [0, 1, 2, 3]
    (run / "tb" / "events.out.tfevents.0.bogus").write_bytes(b"\xff" * 64)
    assert final_scalars(run) == {"tb:tb/acc": pytest.approx(0.3)}


def test_compare_of_user_runs_shows_shared_tensorboard_scalars(tmp_path: Path,
                                                               tmp_path_factory: pytest.TempPathFactory) -> None:
    runs = []
    for name in ("a", "b"):
        run = written_by_tensorflow(tmp_path_factory, f"run-{name}", tmp_path / name)
        (run / "run.json").write_text(json.dumps({"status": "succeeded", "exit_code": 0, "wall_time_s": 12.0}))
        runs.append(run)
    headers, rows, partial = table(load_all(runs))
    assert "tb:outputs/tb/accuracy" in headers and partial == []
    column = headers.index("tb:outputs/tb/accuracy")
    assert [row[column] for row in rows] == ["0.8", "0.9"]


def test_a_directory_with_only_event_files_is_a_run(tmp_path: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    written_by_tensorflow(tmp_path_factory, "only", tmp_path / "only")
    (run,) = load_all([tmp_path / "only"])
    assert run.metrics == {"tb:x": 1.0} and run.status is None
