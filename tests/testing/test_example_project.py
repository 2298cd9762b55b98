"""examples/ci-project, tested the way a user meets it: cloudtrain built as a wheel and installed
(not editable) into a fresh venv, the project copied to an empty temp dir, its own pytest run there.

Why a wheel and not our venv: what users get is the wheel. It must carry templates/ and recipes/
inside the package, register the pytest plugin from its own metadata, and work with nothing of
this checkout on sys.path; an editable install hides every one of those mistakes. Why not a full
`pip install cloudtrain[dev]` into the venv: that downloads ~100 MB for every run. So the venv
gets the wheel with --no-deps, and a .pth file lends it the third-party packages of the venv
running this test (click, boto3, moto, paramiko, pytest, ...). A .pth line adds a directory
without processing the .pth files in it, so our editable install's path hook stays out, and
the venv's own site-packages comes first: `cloudtrain` is imported from the wheel (checked).
(`venv --system-site-packages` would lend the base interpreter's packages, not this venv's.)

Nothing of our tests/conftest.py reaches the project: it runs from its own directory with its
own configuration, as in a user's CI. Files must appear only in temp dirs: HOME stays empty,
the project copy unchanged, the real ~/.ssh untouched.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

from tests.conftest import REPO, default_sigint

EXAMPLE = REPO / "examples" / "ci-project"


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _run(args: list[str], **kwargs: object) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(args, capture_output=True, text=True, preexec_fn=default_sigint, check=False, **kwargs)  # type: ignore[call-overload]
    assert proc.returncode == 0, f"{' '.join(map(str, args))}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc


def test_example_project_passes_against_a_wheel_install(tmp_path: Path) -> None:
    wheels, venv, project, home, tmp = (tmp_path / n for n in ("wheels", "venv", "project", "home", "tmp"))
    for directory in (home, tmp):
        directory.mkdir()
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(REPO)])
    (wheel,) = wheels.glob("cloudtrain-*.whl")
    # `pip install "cloudtrain[dev]"` brings everything the kit imports at run time.
    with zipfile.ZipFile(wheel) as archive:
        metadata = archive.read(next(n for n in archive.namelist() if n.endswith(".dist-info/METADATA"))).decode()
    dev = {re.split(r"[\[<>=;! ]", line.split(":", 1)[1].strip())[0].lower()
           for line in metadata.splitlines() if line.startswith("Requires-Dist:") and "extra == 'dev'" in line}
    assert {"paramiko", "cryptography", "boto3", "moto", "pytest", "werkzeug"} <= dev, dev
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    site = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    ours = dict.fromkeys([sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]])
    (site / "zz-borrowed-deps.pth").write_text("".join(f"{p}\n" for p in ours))
    _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index", "-q", str(wheel)])

    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLOUDTRAIN_", "PYTHONPATH", "AWS_"))}
    env.update(HOME=str(home), TMPDIR=str(tmp), PYTHONDONTWRITEBYTECODE="1", PATH=f"{venv / 'bin'}:{env['PATH']}")
    # CLOUDTRAIN_TEST_SESSION stays: our suite fails if a process the project's tests start outlives them.
    env["CLOUDTRAIN_TEST_SESSION"] = os.environ["CLOUDTRAIN_TEST_SESSION"]
    where = _run([str(python), "-c", "import cloudtrain.testing.plugin as p; print(p.__file__)"], env=env, cwd=tmp)
    assert where.stdout.strip().startswith(str(site)), where.stdout  # the wheel, not this checkout
    assert "cloudtrain run" in _run([str(venv / "bin" / "cloudtrain"), "--help"], env=env, cwd=tmp).stdout

    shutil.copytree(EXAMPLE, project)
    before = _files(project)
    ssh_dir = Path(pwd.getpwuid(os.getuid()).pw_dir) / ".ssh"
    ssh_before = sorted((p.name, p.stat().st_mtime) for p in ssh_dir.iterdir()) if ssh_dir.is_dir() else None

    proc = subprocess.run(
        [str(python), "-m", "pytest", "-p", "no:cacheprovider", "--basetemp", str(tmp / "pytest"), "-q"],
        cwd=project, env=env, capture_output=True, text=True, timeout=600, preexec_fn=default_sigint, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-3000:]
    assert "8 passed" in proc.stdout, proc.stdout[-3000:]

    assert _files(project) == before  # nothing written into the project
    assert _files(home) == []  # nor into HOME: every fixture has a home of its own under TMPDIR
    ssh_after = sorted((p.name, p.stat().st_mtime) for p in ssh_dir.iterdir()) if ssh_dir.is_dir() else None
    assert ssh_after == ssh_before  # nor into the real ~/.ssh
