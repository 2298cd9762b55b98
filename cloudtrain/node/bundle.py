"""The node program as one zipapp, built in memory from this package (the laptop side of shipping).

Deterministic bytes: entries sorted, fixed timestamps and modes, so that the same code gives the same
file and the node's "install only when it changed" stays a no-op. Built once per process.
"""

from __future__ import annotations

import io
import os
import zipfile

_FIXED_TIME = (1980, 1, 1, 0, 0, 0)
# The zipapp's entry point: `python3 watchdog.pyz MODE CONFIG` runs the package's CLI.
_MAIN = "import sys\nfrom cloudtrain.node.__main__ import main\nsys.exit(main(sys.argv))\n"
_built: list = []


def _sources() -> list:
    """(name in the zip, text) of every module of this package, and the empty parent package."""
    here = os.path.dirname(os.path.abspath(__file__))
    found = [("__main__.py", _MAIN), ("cloudtrain/__init__.py", "")]
    for name in sorted(os.listdir(here)):
        if name.endswith(".py"):
            with open(os.path.join(here, name), encoding="utf-8") as handle:
                found.append((f"cloudtrain/node/{name}", handle.read()))
    return sorted(found)


def build() -> bytes:
    """The zipapp's bytes: a shebang line for python3, then the zip."""
    out = io.BytesIO()
    out.write(b"#!/usr/bin/env python3\n")
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for name, text in _sources():
            info = zipfile.ZipInfo(name, date_time=_FIXED_TIME)
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            archive.writestr(info, text.encode("utf-8"), compresslevel=9)
    return out.getvalue()


def program() -> bytes:
    """build(), once per process (the package's files do not change under a running CLI)."""
    if not _built:
        _built.append(build())
    return _built[0]
