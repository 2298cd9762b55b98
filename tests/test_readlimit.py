"""read_at_most: never more than limit + 1 bytes, never a buffer of the limit's size up front."""

from __future__ import annotations

import io

import pytest

from cloudtrain import readlimit
from cloudtrain.readlimit import read_at_most

pytestmark = pytest.mark.quick


class _Counting(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.asked: list[int] = []

    def read(self, size: int | None = -1, /) -> bytes:
        self.asked.append(-1 if size is None else size)
        return super().read(size)


# (input length, limit, bytes back)
CASES = [(0, 10, 0), (5, 10, 5), (10, 10, 10), (11, 10, 11), (100, 10, 11), (3 * readlimit.CHUNK + 7, 2 * readlimit.CHUNK, 2 * readlimit.CHUNK + 1)]


@pytest.mark.parametrize(("length", "limit", "back"), CASES, ids=range(len(CASES)))
def test_reads_at_most_one_byte_past_the_limit_in_pieces(length: int, limit: int, back: int) -> None:
    handle = _Counting(bytes(length))
    assert len(read_at_most(handle, limit)) == back
    assert max(handle.asked) <= readlimit.CHUNK
