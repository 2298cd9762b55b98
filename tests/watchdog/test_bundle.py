"""The node program as it is shipped (issue 39.1): cloudtrain/node as one zipapp, the same bytes for
the same code, installed by the CLI's installer (_BOOT) only when it changed, 0600."""

from __future__ import annotations

import base64
import io
import json
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

from cloudtrain.node import bundle
from cloudtrain.run.watchdog import _BOOT
from tests.watchdog.conftest import NodeDir


def test_the_zipapp_is_the_same_bytes_for_the_same_code_and_holds_the_package() -> None:
    first, second = bundle.build(), bundle.build()
    assert first == second and bundle.program() == first
    names = zipfile.ZipFile(io.BytesIO(first)).namelist()
    assert names == sorted(names) and "__main__.py" in names and "cloudtrain/node/protocol.py" in names
    assert all(info.date_time == (1980, 1, 1, 0, 0, 0) for info in zipfile.ZipFile(io.BytesIO(first)).infolist())


def test_the_installer_writes_the_program_once_and_runs_its_ensure(tmp_path: Path) -> None:
    node = NodeDir(tmp_path / "home" / ".cloudtrain" / "wd")
    program = node.root / "runtime" / "installed" / "watchdog.pyz"
    payload = json.dumps({"program": base64.b64encode(bundle.program()).decode(), "secrets": {},
                          "config": node.config(action={"kind": "exec", "effect": "stop", "argv": ["true"]})})

    def install() -> dict:
        done = subprocess.run([sys.executable, "-c", _BOOT, str(program), str(node.config_path)], input=payload,
                              capture_output=True, text=True, timeout=60, check=True)
        return json.loads(done.stdout.strip().splitlines()[-1])

    try:
        assert install()["status"] == "written"  # nothing to enforce: no loop starts
        assert program.read_bytes() == bundle.program() and stat.S_IMODE(program.stat().st_mode) == 0o600
        assert stat.S_IMODE(program.parent.stat().st_mode) == 0o700
        before = program.stat()
        assert install()["status"] == "unchanged"
        after = program.stat()
        assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns)  # not written again
        usage = subprocess.run([sys.executable, str(program)], capture_output=True, text=True, timeout=60)
        assert usage.returncode == 2 and "watchdog.pyz run" in usage.stderr
    finally:
        node.close()
