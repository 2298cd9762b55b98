"""Reading at most so many bytes of untrusted input, without asking for them all at once.

`f.read(n)` allocates n bytes up front (http.client even zero-fills them), so "read one byte past
the bound" with a 256 MiB bound costs 256 MiB every time. This reads in 1 MiB pieces instead.
"""

from __future__ import annotations

from typing import Protocol

CHUNK = 1 << 20


class _Readable(Protocol):
    def read(self, size: int = ..., /) -> bytes: ...


def read_at_most(handle: _Readable, limit: int) -> bytes:
    """Up to limit + 1 bytes from handle: more than limit bytes back means the input is too large."""
    chunks: list[bytes] = []
    total = 0
    while total <= limit:
        chunk = handle.read(min(CHUNK, limit + 1 - total))
        if not chunk:
            break
        chunks.append(chunk)
        total += len(chunk)
    return b"".join(chunks)
