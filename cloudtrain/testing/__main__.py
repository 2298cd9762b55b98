"""`python -m cloudtrain.testing shell aws|gcp|azure [--dir DIR]`: a fake cloud for your shell.

The test kit's fakes, outside pytest: the cloud's fake API (moto's EC2 for aws, the fake Compute
Engine for gcp, the fake ARM for azure) and an sshd "VM" on this machine for every instance it
launches, exactly as the `<cloud>_cloud` fixtures set them up (docs/testing.md). It prints the
`export` lines that point `cloudtrain` at the fake (also written to `<dir>/env.sh`), a ready
recipe and the next commands, then waits. Ctrl-C (or SIGTERM, or a closed terminal) takes down
every cluster it knows, stops the VMs with every job they ran and the fake itself, and removes
its directory (kept with `--dir`). A walk through it: docs/first-cloud-run.md.

Every line it prints on stdout is an `export`/`unset` line or a `#` comment, so all of it can be
pasted into a shell. Bad arguments: one line, exit 2.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

CLOUDS = ("aws", "gcp", "azure")
USAGE = "usage: python -m cloudtrain.testing shell aws|gcp|azure [--dir DIR]"
CLUSTER = "hello"  # the ready recipe's name: a fixed one, so the guide's commands run as written

TRAIN_PY = textwrap.dedent('''\
    """A stand-in for your training script: five "epochs", then its metrics in outputs/."""
    import json
    import os
    import time

    loss = 1.0
    for epoch in range(1, 6):
        time.sleep(0.2)
        loss *= 0.5
        print(f"epoch {epoch}/5  loss {loss:.4f}", flush=True)
    os.makedirs("outputs", exist_ok=True)
    with open("outputs/metrics.json", "w") as out:
        json.dump({"final_loss": loss, "epochs": 5}, out)
    print("wrote outputs/metrics.json")
    ''')


class _Stop(Exception):
    """A signal asked the shell to stop."""


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] in (["-h"], ["--help"], ["help"]):
        print(USAGE)
        print(__doc__.split("\n", 1)[1].strip())
        return 0
    if not args or args[0] != "shell":
        return _fail(f"expected the command `shell`, got {' '.join(args) or 'nothing'!r} ({USAGE})")
    rest = args[1:]
    directory: Path | None = None
    if "--dir" in rest:
        at = rest.index("--dir")
        if at + 1 >= len(rest):
            return _fail(f"--dir needs a directory ({USAGE})")
        directory = Path(rest[at + 1]).expanduser().resolve()
        del rest[at:at + 2]
    if len(rest) != 1 or rest[0] not in CLOUDS:
        got = " ".join(rest) or "nothing"
        return _fail(f"expected one cloud, aws, gcp or azure, got {got!r} ({USAGE})")
    cloud_name = rest[0]
    from cloudtrain.testing import sshd

    if not sshd.sshd_available():
        return _fail(f"the fake's machines are OpenSSH sshd processes and {sshd.SSHD} is not installed "
                     "(apt-get install openssh-server)")
    try:
        import moto  # noqa: F401
        import pytest  # noqa: F401
    except ImportError as exc:
        return _fail(f"the fake clouds come with cloudtrain's [dev] extra (pip install \"cloudtrain[dev]\"): {exc}")
    return shell(cloud_name, directory)


def shell(cloud_name: str, directory: Path | None) -> int:
    """Start the fake, print its environment, wait for a signal, tear everything down."""
    keep = directory is not None
    if directory is None:
        root = Path(tempfile.mkdtemp(prefix=f"cloudtrain-fake-{cloud_name}-"))
    else:
        root = directory
        root.mkdir(parents=True, exist_ok=True)
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}

    def stop(signum: int, _frame: Any) -> None:
        raise _Stop(signal.Signals(signum).name)

    for sig in previous:
        signal.signal(sig, stop)
    code = 0
    try:
        with _fake(cloud_name, root) as (cloud, env, unset, project):
            _announce(cloud_name, cloud, root, keep, env, unset, project)
            try:
                threading.Event().wait()  # until a signal's handler raises _Stop
            except (_Stop, KeyboardInterrupt) as why:
                print(f"# {why or 'SIGINT'}: stopping the fake {cloud_name} and everything it started",
                      file=sys.stderr, flush=True)
        print(f"# the fake {cloud_name} is stopped: nothing it started is left running", file=sys.stderr)
    except (_Stop, KeyboardInterrupt) as why:
        print(f"# {why or 'SIGINT'} while the fake {cloud_name} was starting: stopped", file=sys.stderr)
    except Exception as exc:  # noqa: BLE001 - one line, not a traceback, for a newcomer's shell
        print(f"error: the fake {cloud_name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        code = 1
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return code


@contextmanager
def _fake(cloud_name: str, root: Path) -> Iterator[tuple[Any, dict[str, str], list[str], Path]]:
    """The `<cloud>_cloud` fixture's setup for a shell: (cloud, the environment to export, the
    variables to unset, the project with the ready recipe). Everything stops on the way out, even
    if a second signal arrives while it does."""
    import pytest

    from cloudtrain.testing.cloud import CloudMachines
    from cloudtrain.testing.mux import stop_muxes
    from cloudtrain.testing.sshd import SshdFactory

    with ExitStack() as stack:
        mp = stack.enter_context(pytest.MonkeyPatch.context())
        factory = SshdFactory(root / "vms")
        stack.callback(factory.close)
        machines = CloudMachines(factory)
        if cloud_name == "aws":
            from cloudtrain.testing.aws import _AWS_VARS_TO_CLEAR, AwsCloud, MotoServer, isolate_aws_env

            unset = [*_AWS_VARS_TO_CLEAR, *sorted(n for n in os.environ if n.startswith("AWS_ENDPOINT_URL"))]
            server: Any = MotoServer().start()
            stack.callback(server.stop)
            isolate_aws_env(mp, root, server.env())
            cloud: Any = AwsCloud(root / "cloud", mp, server, machines, hint="shell")
            extra = {n: os.environ[n] for n in ("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE")}
        else:
            if cloud_name == "gcp":
                from cloudtrain.testing.gcp import _GCP_VARS_TO_CLEAR as clear
                from cloudtrain.testing.gcp import GceServer as Server
                from cloudtrain.testing.gcp import GcpCloud as Cloud
            else:
                from cloudtrain.testing.azure import _AZURE_VARS_TO_CLEAR as clear  # type: ignore[assignment]
                from cloudtrain.testing.azure import ArmServer as Server  # type: ignore[assignment]
                from cloudtrain.testing.azure import AzureCloud as Cloud  # type: ignore[assignment]
            unset = list(clear)
            server = Server(root / cloud_name).start()
            stack.callback(server.stop)
            for name in clear:
                mp.delenv(name, raising=False)
            for name, value in server.env().items():
                mp.setenv(name, value)
            cloud = Cloud(root / "cloud", mp, server, machines, hint="shell")
            extra = {}
        stack.callback(cloud.close)
        stack.callback(stop_muxes, cloud.home)  # the connections your commands kept open
        stack.callback(_down_everything, cloud)
        project = _project(cloud, root / "project")
        cloud.configure(runs_dir=str(project / "runs"))  # next to the recipe, as `runs/` from your project
        env = {**cloud.env, **extra, "CLOUDTRAIN_FAKE_PROJECT": str(project)}
        # The teardown must finish even if Ctrl-C is pressed again.
        stack.callback(_hold_signals)
        yield cloud, env, [n for n in unset if n not in env], project


def _hold_signals() -> None:
    def note(signum: int, _frame: Any) -> None:
        print(f"# {signal.Signals(signum).name}: still stopping the fake, one moment", file=sys.stderr)

    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, note)


def _down_everything(cloud: Any) -> None:
    """`down --forget` every cluster in the fake's state: ends their jobs and deletes their machines."""
    for record in cloud._tracked():
        try:
            result = cloud.cli("down", "--forget", record.name, timeout=120)
        except subprocess.TimeoutExpired:
            print(f"# down {record.name} took over 2 minutes; its machines are stopped with the fake", file=sys.stderr)
            continue
        if not result.ok:
            print(f"# down {record.name}: exit {result.returncode}; its machines are stopped with the fake",
                  file=sys.stderr)


def _project(cloud: Any, project: Path) -> Path:
    """A folder with a small job and its recipe for this fake (`train.yaml`)."""
    import yaml

    project.mkdir(parents=True, exist_ok=True)
    (project / "train.py").write_text(TRAIN_PY)
    resources = cloud.recipe_resources()
    note = ""
    if "image" in resources:
        note = "# On a real account, remove the `image:` line: it names the fake's own image.\n"
    recipe = {"name": CLUSTER, "resources": resources, "workdir": ".", "run": "python3 train.py",
              "results": ["outputs"]}
    (project / "train.yaml").write_text(
        f"# A first recipe, for the fake {cloud.name} of `python -m cloudtrain.testing shell {cloud.name}`.\n"
        + note + yaml.safe_dump(recipe, sort_keys=False))
    if CLUSTER not in cloud.clusters:
        cloud.clusters.append(CLUSTER)
    return project


def _announce(cloud_name: str, cloud: Any, root: Path, keep: bool, env: dict[str, str], unset: list[str],
              project: Path) -> None:
    bindir = Path(sys.executable).parent
    lines = [f"export {name}={shlex.quote(value)}" for name, value in env.items()]
    lines.append(f"export PATH={shlex.quote(str(bindir))}:\"$PATH\"")
    if unset:
        lines.append("unset " + " ".join(unset))
    env_file = root / "env.sh"
    env_file.write_text("\n".join(lines) + "\n")
    what = {"aws": "moto's EC2", "gcp": "a fake Compute Engine", "azure": "a fake Azure Resource Manager"}[cloud_name]
    out = [
        f"# cloudtrain's fake {cloud_name} is up: {what} at {cloud.server.url}, and an sshd on this machine",
        "# for every instance it launches. Nothing leaves this machine; nothing is billed.",
        "# In another terminal, point cloudtrain at it (this shell's HOME is the fake's too):",
        f"#   source {shlex.quote(str(env_file))}",
        "# which holds these lines:",
        *lines,
        f"# A ready recipe: {project / 'train.yaml'} (it runs train.py next to it). Try:",
        "#   cd \"$CLOUDTRAIN_FAKE_PROJECT\"",
        f"#   cloudtrain check {cloud_name}",
        "#   cloudtrain plan train.yaml",
        "#   cloudtrain run train.yaml --keep",
        f"#   cloudtrain status {CLUSTER}",
        "#   cloudtrain cost",
        f"#   cloudtrain down {CLUSTER}",
        "# Walk-through: docs/first-cloud-run.md. Faults and preemption: docs/testing.md.",
        f"# Ctrl-C here (or kill -TERM {os.getpid()}) takes it all down"
        + (f"; {root} is kept." if keep else f" and removes {root}."),
    ]
    print("\n".join(out), flush=True)


if __name__ == "__main__":
    sys.exit(main())
