"""templates/bootstrap.sh, run for real under plain `sh` in a throwaway HOME.

A fake `nvidia-smi` on PATH stands in for a GPU VM (or a broken driver); the installer is replaced
through CLOUDTRAIN_PIP_INSTALL by a stub that records its argument and puts a stand-in `tensorflow`
package into the target interpreter's site-packages, exactly where pip would. When the tests run as
root, the script runs as `nobody`, as it would run as `ubuntu` on a VM.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from cloudtrain import paths

SCRIPT = paths.templates_dir() / "bootstrap.sh"
NOBODY = 65534
FAKE_SMI = """#!/bin/sh
case "$*" in
*--query-gpu*) echo "Tesla T4, 535.104.05, 15360 MiB" ;;
*) cat <<'EOF'
+---------------------------------------------------------------------------------------+
| NVIDIA-SMI 535.104.05             Driver Version: 535.104.05   CUDA Version: 12.2     |
|-----------------------------------------+----------------------+----------------------+
EOF
;;
esac
"""
BROKEN_SMI = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""
# What pip would do, minus the download: the package lands in the target's site-packages.
STUB_INSTALLER = """#!/bin/sh
echo "$1" >> "$HOME/installs.log"
site=$("$CLOUDTRAIN_TARGET_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
mkdir -p "$site/tensorflow"
echo '__version__ = "2.99.0"' > "$site/tensorflow/__init__.py"
"""


@dataclass(frozen=True)
class Vm:
    root: Path
    home: Path
    bin: Path

    def run(
        self, *args: str, gpu: str | None = None, extra_env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess:
        smi = self.bin / "nvidia-smi"
        smi.unlink(missing_ok=True)
        if gpu is not None:
            smi.write_text(FAKE_SMI if gpu == "ok" else BROKEN_SMI)
            smi.chmod(0o755)
        env = {
            "HOME": str(self.home),
            "PATH": f"{self.bin}:/usr/bin:/bin",
            "CLOUDTRAIN_PYTHON": "/usr/bin/python3",
            "CLOUDTRAIN_PIP_INSTALL": str(self.bin / "stub-pip"),
            **(extra_env or {}),
        }
        argv = ["sh", str(self.root / "bootstrap.sh"), *args]
        if os.geteuid() == 0:
            argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]
        return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)

    def installs(self) -> list[str]:
        log = self.home / "installs.log"
        return log.read_text().splitlines() if log.exists() else []


def report(result: subprocess.CompletedProcess) -> dict:
    assert result.stdout.count("\n") == 1, result.stdout + result.stderr
    return json.loads(result.stdout)


@pytest.fixture
def vm() -> Iterator[Vm]:
    if not Path("/usr/bin/python3").exists():
        pytest.skip("needs /usr/bin/python3")
    # Not under pytest's tmp_path: its parents are private to root and the script runs as nobody.
    root = Path(tempfile.mkdtemp(prefix="ct-bootstrap-"))
    root.chmod(0o755)
    home, bindir = root / "home", root / "bin"
    home.mkdir()
    bindir.mkdir()
    shutil.copy(SCRIPT, root / "bootstrap.sh")
    (bindir / "stub-pip").write_text(STUB_INSTALLER)
    (bindir / "stub-pip").chmod(0o755)
    if os.geteuid() == 0:
        os.chown(home, NOBODY, NOBODY)
    try:
        yield Vm(root, home, bindir)
    finally:
        shutil.rmtree(root)


def test_script_is_posix_sh() -> None:
    subprocess.run(["sh", "-n", str(SCRIPT)], check=True)
    assert SCRIPT.read_text().startswith("#!/bin/sh\n")


def test_report_on_a_gpu_vm(vm: Vm) -> None:
    result = vm.run(gpu="ok")
    assert result.returncode == 0, result.stderr
    got = report(result)
    assert got["gpu"] is True and got["gpu_count"] == 1 and got["nvidia_smi"] == "ok"
    assert got["gpus"] == [{"name": "Tesla T4", "driver": "535.104.05", "memory": "15360 MiB"}]
    assert (got["driver_version"], got["cuda_version"]) == ("535.104.05", "12.2")
    assert got["python_version"].startswith("3.")
    assert got["tf_package"] == "tensorflow[and-cuda]"
    assert got["tensorflow"] is None and got["installed"] is None and got["would_install"] is None
    # Report-only touches nothing.
    assert not (vm.home / ".cloudtrain").exists() and vm.installs() == []


@pytest.mark.parametrize(("gpu", "smi_state"), [(None, "absent"), ("broken", "failed")])
def test_report_without_a_working_driver_picks_cpu_tensorflow(vm: Vm, gpu: str | None, smi_state: str) -> None:
    got = report(vm.run(gpu=gpu))
    assert (got["gpu"], got["gpu_count"], got["nvidia_smi"]) == (False, 0, smi_state)
    assert got["driver_version"] is None and got["cuda_version"] is None
    assert got["tf_package"] == ("tensorflow-cpu" if got["arch"] == "x86_64" else "tensorflow")


def test_dry_run_says_what_it_would_install_and_installs_nothing(vm: Vm) -> None:
    got = report(vm.run("--ensure-tf", "--dry-run", gpu="ok"))
    assert got["would_install"] == "tensorflow[and-cuda]" and got["installed"] is None
    assert vm.installs() == [] and not (vm.home / ".cloudtrain").exists()


def test_ensure_installs_once_into_a_user_venv_then_nothing(vm: Vm) -> None:
    first = vm.run("--ensure-tf", gpu="ok")
    assert first.returncode == 0, first.stderr
    got = report(first)
    venv_python = str(vm.home / ".cloudtrain" / "venv" / "bin" / "python")
    assert got["installed"] == "tensorflow[and-cuda]" and got["tensorflow"] == "2.99.0"
    assert got["python"] == venv_python
    assert vm.installs() == ["tensorflow[and-cuda]"]
    if os.geteuid() == 0:
        assert (vm.home / ".cloudtrain" / "venv").stat().st_uid == NOBODY

    second = vm.run("--ensure-tf", gpu="ok")
    assert second.returncode == 0, second.stderr
    again = report(second)
    assert again["installed"] is None and again["tensorflow"] == "2.99.0" and again["python"] == venv_python
    assert vm.installs() == ["tensorflow[and-cuda]"]  # idempotent: the second run installed nothing


def test_ensure_on_a_cpu_vm_installs_cpu_tensorflow_with_the_pin(vm: Vm) -> None:
    got = report(vm.run("--ensure-tf", extra_env={"CLOUDTRAIN_TF_VERSION": "==2.16.*"}))
    expected = ("tensorflow-cpu" if got["arch"] == "x86_64" else "tensorflow") + "==2.16.*"
    assert got["installed"] == expected and vm.installs() == [expected]


def test_installer_failures_are_exit_codes_not_silence(vm: Vm) -> None:
    failing = vm.run("--ensure-tf", extra_env={"CLOUDTRAIN_PIP_INSTALL": "false"})
    assert failing.returncode == 4 and "failed" in failing.stderr
    no_op = vm.run("--ensure-tf", extra_env={"CLOUDTRAIN_PIP_INSTALL": "true"})
    assert no_op.returncode == 5 and "still does not import" in no_op.stderr
    assert report(no_op)["tensorflow"] is None


def test_unknown_option_is_a_usage_error(vm: Vm) -> None:
    result = vm.run("--ensure-tensorflow")
    assert result.returncode == 2 and "unknown option" in result.stderr


def _wheel(directory: Path, name: str = "ctprobe") -> Path:
    """A minimal pure-Python wheel, built by hand: `pip install --no-index` needs no network for it."""
    import zipfile

    path = directory / f"{name}-1.0-py3-none-any.whl"
    files = {f"{name}.py": "VALUE = 42\n",
             f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n",
             f"{name}-1.0.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    record = "".join(f"{n},,\n" for n in files) + f"{name}-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as archive:
        for member, text in {**files, f"{name}-1.0.dist-info/RECORD": record}.items():
            archive.writestr(member, text)
    path.chmod(0o644)
    return path


def test_the_venv_takes_pip_install_on_a_python_that_refuses_it(vm: Vm) -> None:
    """Debian 12 / Ubuntu 24.04 refuse `pip install` (PEP 668); setup runs in the node's venv, where it works."""
    first = vm.run("--venv", "--pip")
    assert first.returncode == 0, first.stderr
    got = report(first)
    venv = vm.home / ".cloudtrain" / "venv"
    assert got["venv"] == str(venv) and got["python"] == str(venv / "bin" / "python") and got["pip"] is True
    assert (venv / ".cloudtrain").exists()  # runner.sh activates this venv for setup and run
    wheel = _wheel(vm.root)
    # What a recipe's `setup: pip install ...` does, with the venv activated as runner.sh does.
    env = {"HOME": str(vm.home), "PATH": f"{venv}/bin:/usr/bin:/bin", "VIRTUAL_ENV": str(venv)}
    argv = ["sh", "-c", f"pip install --no-index --quiet {wheel} && python -c 'import ctprobe; print(ctprobe.VALUE)'"]
    if os.geteuid() == 0:
        argv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]
    installed = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    assert installed.returncode == 0 and installed.stdout.strip() == "42", installed.stdout + installed.stderr
    if Path("/usr/lib/python3/dist-packages").is_dir():
        # The system's packages stay visible (--system-site-packages), the system itself untouched.
        assert not list(Path("/usr/lib/python3/dist-packages").glob("ctprobe*"))
    again = vm.run("--venv", "--pip")
    assert again.returncode == 0 and report(again)["venv"] == str(venv)


FAILURES = [  # (installer, what the user must see: the installer's own reason)
    ("echo 'ERROR: Could not find a version that satisfies the requirement tensorflow-cpu' >&2; exit 1",
     "Could not find a version that satisfies the requirement tensorflow-cpu"),
    ("echo 'WARNING: Retrying after connection broken by NewConnectionError' >&2; "
     "echo 'ERROR: No matching distribution found for tensorflow-cpu' >&2; exit 1",
     "NewConnectionError"),
    ("echo 'SSL: CERTIFICATE_VERIFY_FAILED' >&2; exit 1", "CERTIFICATE_VERIFY_FAILED"),
]


@pytest.mark.parametrize("installer,reason", FAILURES)
def test_a_failed_install_shows_the_installers_reason_and_keeps_the_whole_log(vm: Vm, installer: str,
                                                                           reason: str) -> None:
    script = vm.bin / "failing-pip"
    script.write_text(f"#!/bin/sh\nfor i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do echo noise $i; done\n"
                      f"{installer}\n")
    script.chmod(0o755)
    log = vm.home / "bootstrap.log"
    failed = vm.run("--ensure-tf", "--log", str(log), extra_env={"CLOUDTRAIN_PIP_INSTALL": str(script)})
    assert failed.returncode == 4
    assert reason in failed.stderr and "failed (exit 1); its last lines" in failed.stderr, failed.stderr
    assert "noise 1\n" not in failed.stderr  # the last lines, not everything
    assert "noise 1\n" in log.read_text() and reason in log.read_text()  # everything, on the node
