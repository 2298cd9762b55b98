"""TensorBoard scalars from a run's event files, without TensorFlow or the tensorboard package.

`compare` runs on the laptop, where neither may be installed (tensorboard is not a dependency of
TensorFlow 2.21 either, and it pulls grpcio and a web server). The format is small and stable:
event files are TFRecord streams (u64 length, u32 masked CRC, payload, u32 masked CRC) of `Event`
protobufs, so this hand-writes the few wire-format fields a scalar needs (tensorflow/core/util/
event.proto, core/framework/summary.proto and tensor.proto). CRCs are not checked (stdlib has no
CRC32C); a truncated or malformed record ends that file's reading, as TensorBoard's own loader does
for a file still being written. Reading is bounded: event files from a node are untrusted input.

What counts as a scalar: a `simple_value` (TF1, tf-keras) or a rank-0 float/int tensor (TF2's
tf.summary.scalar and tf.summary.write with the scalars plugin). The value kept per tag is the one
at the highest step (the last one written on ties), which is what a run ended with.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from cloudtrain.readlimit import read_at_most

EVENT_FILE_MARK = "tfevents"
MAX_FILE_BYTES = 256 << 20
MAX_FILES = 200
MAX_RECORD_BYTES = 16 << 20

# tensorflow/core/framework/types.proto
_DT_FLOAT, _DT_DOUBLE, _DT_INT32, _DT_INT64, _DT_HALF = 1, 2, 3, 9, 19


@dataclass(frozen=True)
class Scalar:
    tag: str
    step: int
    value: float


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf) or shift > 63:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """(field number, wire type, value) for each field of a protobuf message; value is an int for
    varint and fixed types (fixed ones as raw little-endian bits), bytes for length-delimited."""
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
            yield number, wire, value
        elif wire == 1:
            if pos + 8 > len(buf):
                raise ValueError("truncated fixed64")
            yield number, wire, int.from_bytes(buf[pos:pos + 8], "little")
            pos += 8
        elif wire == 5:
            if pos + 4 > len(buf):
                raise ValueError("truncated fixed32")
            yield number, wire, int.from_bytes(buf[pos:pos + 4], "little")
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if pos + size > len(buf):
                raise ValueError("truncated field")
            yield number, wire, buf[pos:pos + size]
            pos += size
        else:
            raise ValueError(f"unsupported wire type {wire}")


def _tensor_scalar(buf: bytes) -> float | None:
    """A rank-0 numeric TensorProto's value; None for anything else (histograms, images, text)."""
    dtype, content, packed = 0, b"", {}
    for number, wire, value in _fields(buf):
        if number == 1 and wire == 0:
            dtype = int(value)  # type: ignore[arg-type]
        elif number == 2 and wire == 2 and value:
            return None  # a non-empty shape: not a scalar
        elif number == 4 and wire == 2:
            content = bytes(value)  # type: ignore[arg-type]
        elif number in (5, 6, 7, 10, 13):
            packed.setdefault(number, []).append((wire, value))
    formats = {_DT_FLOAT: ("<f", 5, 4), _DT_DOUBLE: ("<d", 6, 8), _DT_INT32: ("<i", 7, 4), _DT_INT64: ("<q", 10, 8),
               _DT_HALF: ("<e", 13, 2)}
    if dtype not in formats:
        return None
    fmt, field_number, size = formats[dtype]
    if len(content) == size:
        return float(struct.unpack(fmt, content)[0])
    for wire, value in packed.get(field_number, []):
        if wire == 2 and isinstance(value, bytes) and value:
            if dtype in (_DT_FLOAT, _DT_DOUBLE):
                return float(struct.unpack_from(fmt, value)[0])
            return float(_signed(_varint(value, 0)[0]))  # packed varints (int_val, int64_val, half_val)
        if wire == 5 and isinstance(value, int):
            return float(struct.unpack("<f", value.to_bytes(4, "little"))[0])
        if wire == 1 and isinstance(value, int):
            return float(struct.unpack("<d", value.to_bytes(8, "little"))[0])
        if wire == 0 and isinstance(value, int):
            return float(_signed(value))
    return None


def _signed(value: int) -> int:
    return value - (1 << 64) if value >= 1 << 63 else value


def _summary_values(buf: bytes) -> Iterator[tuple[str, float]]:
    for number, wire, value in _fields(buf):
        if number != 1 or wire != 2:
            continue
        tag, scalar = "", None
        for vnum, vwire, v in _fields(value):  # type: ignore[arg-type]
            if vnum == 1 and vwire == 2:
                tag = bytes(v).decode("utf-8", "replace")  # type: ignore[arg-type]
            elif vnum == 2 and vwire == 5:
                scalar = float(struct.unpack("<f", int(v).to_bytes(4, "little"))[0])  # type: ignore[arg-type]
            elif vnum == 8 and vwire == 2 and scalar is None:
                scalar = _tensor_scalar(v)  # type: ignore[arg-type]
        if tag and scalar is not None and math.isfinite(scalar):
            yield tag, scalar


def _records(data: bytes) -> Iterator[bytes]:
    pos = 0
    while pos + 12 <= len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        if length > MAX_RECORD_BYTES or pos + 12 + length + 4 > len(data):
            return  # truncated (a file still being written) or not an event file
        yield data[pos + 12:pos + 12 + length]
        pos += 12 + length + 4


def read_event_file(path: Path) -> list[Scalar]:
    """Every scalar in one event file, in file order. Raises ValueError for a file too large to read."""
    with open(path, "rb") as handle:
        data = read_at_most(handle, MAX_FILE_BYTES)
    if len(data) > MAX_FILE_BYTES:
        raise ValueError(f"{path}: event file larger than {MAX_FILE_BYTES >> 20} MiB")
    out: list[Scalar] = []
    for record in _records(data):
        step, summary = 0, None
        try:
            for number, wire, value in _fields(record):
                if number == 2 and wire == 0:
                    step = _signed(int(value))  # type: ignore[arg-type]
                elif number == 5 and wire == 2:
                    summary = value
            if summary is not None:
                out.extend(Scalar(tag, step, v) for tag, v in _summary_values(summary))  # type: ignore[arg-type]
        except ValueError:
            break  # a malformed record: what came before it stands
    return out


def event_files(root: Path) -> list[Path]:
    """Event files under root (symlinks not followed), at most MAX_FILES, in a stable order."""
    found = sorted(p for p in root.rglob(f"*{EVENT_FILE_MARK}*") if p.is_file() and not p.is_symlink())
    return found[:MAX_FILES]


def final_scalars(run_dir: Path) -> dict[str, float]:
    """Each tag's value at its highest step, named `tb:<dir>/<tag>` with dir the event file's
    directory relative to run_dir (Keras writes `train/` and `validation/` with the same tags)."""
    best: dict[str, tuple[int, float]] = {}
    for path in event_files(run_dir):
        where = path.parent.relative_to(run_dir).as_posix()
        for scalar in read_event_file(path):
            name = f"tb:{where}/{scalar.tag}" if where != "." else f"tb:{scalar.tag}"
            if name not in best or scalar.step >= best[name][0]:
                best[name] = (scalar.step, scalar.value)
    return {name: value for name, (_, value) in best.items()}
