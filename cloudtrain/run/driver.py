"""`run --driver HOST`: a run driven by `cloudtrain` on a host the user already has, not the laptop.

Recovery (docs/recovery.md) is driven by the `cloudtrain run` process: with the laptop asleep,
nothing relaunches a preempted node. This starts that same process on an SSH host the user
already has and returns. The laptop checks the host's cloudtrain is this version, syncs the recipe
and its workdir into a directory of the drive's own (`~/.cloudtrain-driver/<drive id>/`, 0700),
starts an ordinary `cloudtrain run` there, detached, through the user's login shell (so the cloud
credentials are the host's own: nothing of the laptop's goes there), waits until that run has its
run id, and records `runs/<run id>/driver.json`. `cloudtrain driver status|log|fetch|cancel RUN`
(cli/driver.py, run/driver_ops.py) look at it later. docs/driver.md.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from cloudtrain.errors import CloudtrainError, RecipeError, UsageError
from cloudtrain.providers.base import HostSpec, Instance, InstanceState

REMOTE_BASE = ".cloudtrain-driver"  # under the driver host's home; one directory per drive
RECORD_FILE = "driver.json"  # in the laptop's runs/<run id>/
# How long `run --driver` waits for the driven run to get its run id: the host's cloudtrain checks
# the recipe and its credentials and plans first (seconds; a cloud's pricing call at most).
START_WAIT_S = 300.0
POLL_S = 0.5
# How long a stop waits for the driven run to end: it ends its job, brings the logs home and takes
# its cluster down (a cloud's terminate call and its confirmation: a minute or two).
STOP_WAIT_S = 600.0
_HOST = re.compile(r"^(?:(?P<user>[^@\s]+)@)?(?P<address>[^@:\s\[\]]+)(?::(?P<port>\d{1,5}))?$")
_VERSION = re.compile(r"^cloudtrain (\S+)$")
# Exactly what a run's id looks like (run/pipeline.new_run_id): nothing else in runs/ is taken for one.
_RUN_ID = re.compile(r"^[a-z0-9][a-z0-9-]*-\d{8}-\d{6}-[0-9a-f]{4}$")


class DriverError(CloudtrainError):
    """What the driven `cloudtrain run` said when it ended before its run started: its own exit code."""

    def __init__(self, message: str, *, exit_code: int, hint: str | None = None) -> None:
        super().__init__(message, hint=hint)
        self.exit_code = exit_code


@dataclass(frozen=True)
class DriverHost:
    """`[user@]address[:port]`, reached as the `ssh` cloud reaches a recipe's hosts (key, or agent and
    default keys; the config's `ssh.proxy_command`; the host key pinned on first contact)."""

    address: str
    user: str | None = None
    port: int = 22
    key: str | None = None

    @property
    def label(self) -> str:
        return (f"{self.user}@" if self.user else "") + self.address + (f":{self.port}" if self.port != 22 else "")

    def spec(self) -> HostSpec:
        return HostSpec(address=self.address, user=self.user, port=self.port, key=self.key)

    def instance(self) -> Instance:
        # The host key is pinned under this id (remote/keys.KnownHosts), apart from any cluster's.
        return Instance(id=f"driver-{self.address}-{self.port}", cluster="driver", state=InstanceState.RUNNING,
                        public_ip=self.address, ssh_user=self.user, ssh_port=self.port)


def parse_host(text: str, key: str | None = None) -> DriverHost:
    match = _HOST.match(text.strip())
    port = int(match.group("port")) if match and match.group("port") else 22
    if match is None or not 1 <= port <= 65535:
        raise UsageError(f"--driver {text!r}: expected [user@]host[:port]",
                         hint="e.g. --driver me@build-box or --driver 10.0.0.5:2222")
    if key is not None:
        if not Path(key).expanduser().is_file():
            raise UsageError(f"--driver-key {key}: no such file", hint="the private key that logs in to the driver host")
        key = str(Path(key).expanduser().resolve())  # driver.json's: the `driver` commands run from anywhere
    return DriverHost(match.group("address"), match.group("user"), port, key)


@dataclass(frozen=True)
class DriverRecord:
    """`runs/<run id>/driver.json` on the laptop: where the run is driven from."""

    run_id: str
    cluster: str  # the driven run's cluster, in the host's state (not this machine's)
    host: str  # [user@]address[:port], as given
    key: str | None
    remote_dir: str  # the drive's directory on the host (recipe, workdir, runs/, driver.log, pid, exit_code)
    pid: int  # the driven `cloudtrain run` process
    cloudtrain: str  # the command that ran it there
    started_at: float

    def driver_host(self) -> DriverHost:
        # The key is not checked again here: a missing one is the SSH error that names it.
        return DriverHost(**{**asdict(parse_host(self.host)), "key": self.key})

    @property
    def remote_run_dir(self) -> str:
        return f"{self.remote_dir}/runs/{self.run_id}"

    def write(self, run_dir: Path) -> Path:
        run_dir.mkdir(parents=True, exist_ok=True)
        path = run_dir / RECORD_FILE
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(asdict(self), indent=1) + "\n")
        os.replace(tmp, path)
        return path

    @classmethod
    def read(cls, runs_dir: Path, run_id: str) -> DriverRecord:
        if not _RUN_ID.match(run_id):
            raise UsageError(f"{run_id!r} is not a run id", hint="like train-20261125-214436-4a1a: the id "
                             "`cloudtrain run --driver` printed")
        path = runs_dir / run_id / RECORD_FILE
        try:
            with path.open() as handle:
                data = json.loads(handle.read(65536))
            record = cls(**{name: data[name] for name in cls.__dataclass_fields__})
            if not isinstance(record.pid, int) or not isinstance(record.remote_dir, str) or record.run_id != run_id:
                raise ValueError("fields of the wrong kind")
            return record
        except FileNotFoundError:
            raise UsageError(f"run {run_id}: no {path}", hint="`cloudtrain driver` acts on runs started with "
                             "`cloudtrain run RECIPE --driver HOST`; pass --runs-dir if they went elsewhere") from None
        except (ValueError, KeyError, TypeError, OSError) as exc:
            raise UsageError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None


def login(inner: str) -> list[str]:
    """argv running the sh command `inner` in the user's login environment: their login shell
    (bash, zsh, fish, ...) reads their profile, which sets PATH and the cloud's credentials there,
    as when they log in, and hands `inner` to sh (passed in a variable: `sh -c "$V"` reads the same
    in every shell, where `$1` or `{ ...; }` would not)."""
    return ["sh", "-c", 'CLOUDTRAIN_DRIVE_CMD=$1; export CLOUDTRAIN_DRIVE_CMD; '
                        'exec "${SHELL:-/bin/sh}" -l -c \'sh -c "$CLOUDTRAIN_DRIVE_CMD"\'', "sh", inner]


def command_word(command: str) -> str:
    """`--driver-cloudtrain` as a sh word: `~/...` is the host's home (a quoted `~` would not be)."""
    if command.startswith("~/"):
        return '"$HOME"/' + shlex.quote(command[2:])
    return shlex.quote(command)


def connect(host: DriverHost, config, *, starting: bool = False):  # noqa: ANN001, ANN201 - Config -> SSHTransport
    """An open transport to the host. At the start a host that does not answer is bad input
    (exit 2); later it is a host that went away (exit 1)."""
    from cloudtrain.remote import ssh

    try:
        return ssh.open_transport(cluster="driver", instance=host.instance(), config=config, host=host.spec())
    except CloudtrainError as exc:
        if starting:
            raise UsageError(f"--driver {host.label}: {exc.message}", hint=exc.hint or
                             "an SSH host you can log in to, [user@]host[:port]; --driver-key names its key") from None
        raise


def local_version() -> str:
    from importlib.metadata import version

    return version("cloudtrain")


def check_cloudtrain(transport, host: DriverHost, command: str) -> str:  # noqa: ANN001
    """The host's cloudtrain version, which must be this one; refused in one line otherwise."""
    mine = local_version()
    install = (f"install cloudtrain {mine} there, with the extras of the clouds it will drive (README), "
               f"or name it with --driver-cloudtrain PATH")
    q = command_word(command)
    result = transport.run(login(f"command -v {q} >/dev/null 2>&1 || {{ echo cloudtrain-missing; exit 0; }}; "
                                 f"{q} --version"),
                           check=False, timeout=120, what="asking the host's cloudtrain its version")
    lines = result.stdout.decode(errors="replace").splitlines()
    if "cloudtrain-missing" in lines:
        raise UsageError(f"--driver {host.label}: no `{command}` on the host's login PATH", hint=install)
    found = [m.group(1) for line in lines if (m := _VERSION.match(line.strip()))]
    if not found:
        said = (result.stderr.decode(errors="replace").strip().splitlines() or ["nothing"])[-1][:200]
        raise UsageError(f"--driver {host.label}: `{command} --version` did not print a cloudtrain version "
                         f"(exit {result.exit_code}: {said})", hint=install)
    if found[-1] != mine:
        raise UsageError(f"--driver {host.label}: cloudtrain {found[-1]} there, {mine} here: a driven run needs "
                         "the same version on both", hint=install)
    return found[-1]


def driven_recipe(loaded, remote_workdir: str | None) -> bytes:  # noqa: ANN001 - LoadedRecipe
    """The recipe as the host reads it: the user's own YAML (its `${VAR}`s filled from the host's
    environment, as any recipe is where it runs), with `workdir` pointing at the synced copy."""
    import yaml

    from cloudtrain.yamlfile import read_yaml

    data, _, _ = read_yaml(loaded.path, RecipeError)
    data = dict(data)
    if remote_workdir is None:
        data.pop("workdir", None)
    else:
        data["workdir"] = remote_workdir
    return yaml.safe_dump(data, sort_keys=False).encode()


def drive_script(command: str, cluster: str, run_args: Sequence[str], env: Mapping[str, str]) -> bytes:
    """The wrapper the host runs detached: the run (its pid in `pid`), then its exit code in
    `exit_code` (written last, atomically: present means the run and its teardown are over).
    Its arguments go to the run (`driver resume`: `--resume RUN`)."""
    argv = ["run", "recipe.yaml", "--cluster", cluster, "--yes", *run_args]
    for key, value in env.items():
        argv += ["--env", f"{key}={value}"]
    # `"$PWD/runs"`: the runs directory by absolute path, which is also how `pid` is told apart
    # from a reused process id (run/driver_ops.probe).
    return (
        "# Written by `cloudtrain run --driver`; started with setsid through the user's login shell.\n"
        'cd "$(dirname "$0")" || exit 1\n'
        "echo $$ > wrapper.tmp && mv wrapper.tmp wrapper\n"
        "unset CLOUDTRAIN_ASKED_BY  # the node helper's mark: this run is no command the laptop waits on\n"
        "unset CLOUDTRAIN_DRIVE_CMD\n"
        f'{command_word(command)} {shlex.join(argv)} --runs-dir "$PWD/runs" "$@" &\n'
        'echo $! > pid.tmp && mv pid.tmp pid\n'
        'wait $!\n'
        'echo $? > exit_code.tmp && mv exit_code.tmp exit_code\n'
    ).encode()


class DriveState(str, Enum):
    STARTING = "starting"  # the wrapper runs, the run has no pid yet
    RUNNING = "running"  # the run's process lives, or it has ended and the wrapper is writing its exit code
    ENDED = "ended"  # exit_code written
    GONE = "gone"  # no exit code and neither process: the wrapper was killed too, or the host restarted


@dataclass(frozen=True)
class Probe:
    state: DriveState
    pid: int | None
    exit_code: int | None
    runs: tuple[str, ...]  # run ids under the drive's runs/


# `alive`: the run's process, told apart from a reused pid by its arguments; `wrapper`: drive.sh,
# which outlives it by the moment it takes to write exit_code (no exit code yet is not "gone" then).
# exit_code is read last: a wrapper seen gone wrote it (if it ever will) before it went.
PROBE = r"""cd "$1" || exit 3
w=$(cat wrapper 2>/dev/null); pid=$(cat pid 2>/dev/null); alive=0; wrapper=0
if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null \
   && ps -ww -o args= -p "$pid" 2>/dev/null | grep -qF -- "$PWD/runs"; then alive=1; fi
if [ -z "$w" ]; then wrapper=starting
elif kill -0 "$w" 2>/dev/null && ps -ww -o args= -p "$w" 2>/dev/null | grep -qF drive.sh; then wrapper=1; fi
code=$(cat exit_code 2>/dev/null)
printf 'pid=%s\nexit=%s\nalive=%s\nwrapper=%s\n' "$pid" "$code" "$alive" "$wrapper"
for d in runs/*/; do [ -d "$d" ] && printf 'run=%s\n' "$(basename "$d")"; done
exit 0
"""


def probe(transport, remote_dir: str) -> Probe:  # noqa: ANN001
    """One round trip: the driven process, its exit code, the runs it made."""
    result = transport.run(["sh", "-c", PROBE, "sh", remote_dir], check=False, timeout=60,
                           what="asking about the driven run")
    if result.exit_code == 3:
        raise CloudtrainError(f"{remote_dir} is not on {transport.label} (removed?)")
    fields: dict[str, str] = {}
    runs = []
    for line in result.stdout.decode(errors="replace").splitlines():
        key, _, value = line.partition("=")
        if key == "run" and _RUN_ID.match(value):
            runs.append(value)
        elif key in ("pid", "exit", "alive", "wrapper"):
            fields[key] = value.strip()
    pid = int(fields["pid"]) if fields.get("pid", "").isdigit() else None
    code = int(fields["exit"]) if fields.get("exit", "").isdigit() else None
    wrapper = fields.get("wrapper")
    if code is not None:
        state = DriveState.ENDED
    elif fields.get("alive") == "1" or (pid is not None and wrapper == "1"):
        state = DriveState.RUNNING
    elif pid is None and wrapper in ("starting", "1"):
        state = DriveState.STARTING
    else:
        state = DriveState.GONE
    return Probe(state, pid, code, tuple(sorted(runs)))


def log_tail(transport, remote_dir: str, lines: int = 20) -> list[str]:  # noqa: ANN001
    # The last lines, and of them the last 64 KiB: one line without newlines cannot fill memory.
    result = transport.run(["sh", "-c", 'tail -n "$2" "$1" | tail -c 65536', "sh", f"{remote_dir}/driver.log",
                            str(lines)], check=False, timeout=60)
    return result.stdout.decode(errors="replace").splitlines()


@dataclass(frozen=True)
class DriveRequest:
    """What `run --driver` was asked: the recipe, the cluster, the flags the host's `run` gets."""

    host: DriverHost
    command: str  # cloudtrain on the host
    cluster: str
    run_args: tuple[str, ...]  # --down/--stop/--keep, -q
    env: Mapping[str, str]


def start(config, loaded, request: DriveRequest, runs_dir: Path,  # noqa: ANN001 - Config, LoadedRecipe
          say: Callable[[str], None]) -> DriverRecord:
    """Check the host, sync, start the driven run, wait for its run id, record it here."""
    from cloudtrain.remote.ignore import load_ignore
    from cloudtrain.run.pipeline import new_run_id

    local = [m.source for m in loaded.recipe.data if "://" not in m.source]
    if local:
        # Refused before any connection: only the workdir travels to the host.
        raise UsageError(f"--driver: data source {local[0]!r} is a path on this machine, which the driver host "
                         "does not have", hint="put it in the workdir, or in a bucket (docs/data.md)")
    host = request.host
    transport = connect(host, config, starting=True)
    try:
        check_cloudtrain(transport, host, request.command)
        remote_dir = f"{transport.home}/{REMOTE_BASE}/{new_run_id(request.cluster)}"
        workdir = f"{remote_dir}/workdir" if loaded.workdir is not None else None
        recipe = driven_recipe(loaded, workdir)
        base = remote_dir.rsplit("/", 1)[0]
        transport.run(["sh", "-c", 'mkdir -p "$1" && chmod 700 "$1" && mkdir -m 700 "$2"', "sh", base, remote_dir],
                      what="making the drive's directory")
        if loaded.workdir is not None:
            say(f"syncing {loaded.workdir} to {host.label}:{workdir}")
            transport.put_tree(loaded.workdir, workdir, ignore=load_ignore(loaded.workdir))
        transport.put_file(recipe, f"{remote_dir}/recipe.yaml", mode=0o600)
        transport.put_file(drive_script(request.command, request.cluster, request.run_args, request.env),
                           f"{remote_dir}/drive.sh", mode=0o700)
        # One step from the remote start to the record here: an interrupt anywhere in it (Ctrl-C,
        # TERM, HUP; also while the start command itself is in flight, when the host may already
        # run it) stops the driven run, so that no run goes on that nobody here can find.
        try:
            # setsid: a session of its own, so neither the node helper's end nor a hangup reaches
            # it. Only setsid's command in the background, its output in driver.log: nothing keeps
            # this command's pipes open after it returns.
            transport.run(login(f"cd {shlex.quote(remote_dir)} || exit 1; "
                                "setsid nohup sh drive.sh >driver.log 2>&1 </dev/null &"),
                          timeout=120, what="starting the driven run")
            say(f"waiting for `cloudtrain run` on {host.label} to start the run (it checks the recipe, its "
                f"credentials and the plan there; up to {START_WAIT_S:.0f} s; its log: {remote_dir}/driver.log)")
            run_id, pid = _wait_for_run(transport, host, remote_dir)
            record = DriverRecord(run_id, request.cluster, host.label, host.key, remote_dir, pid, request.command,
                                  time.time())
            record.write(runs_dir / run_id)
            return record
        except KeyboardInterrupt:
            # The user wants no run, as for any interrupted command; a second signal while it is
            # being stopped is reported, not obeyed (it would leave the run going unseen).
            from cloudtrain.shield import no_interrupts

            with no_interrupts():
                say(f"interrupted: stopping the driven run on {host.label}")
                # A fresh connection: the interrupt may have cut a request of this one in half.
                fresh = connect(host, config)
                try:
                    _stop_starting(fresh, remote_dir, say)
                finally:
                    fresh.close()
            raise
    finally:
        transport.close()


def _stop_starting(transport, remote_dir: str, say: Callable[[str], None]) -> None:  # noqa: ANN001
    # The wrapper writes the run's pid a moment after it starts: wait for it (bounded) to TERM it.
    deadline = time.monotonic() + 30
    while probe(transport, remote_dir).state == DriveState.STARTING and time.monotonic() < deadline:
        time.sleep(POLL_S)
    terminate(transport, remote_dir, say, "the driven run")


def terminate(transport, remote_dir: str, say: Callable[[str], None], what: str,  # noqa: ANN001
              sleep: Callable[[float], None] = time.sleep) -> Probe:
    """SIGTERM to the driven `cloudtrain run`, which takes it as Ctrl-C (cli/run.sigterm_as_interrupt):
    it ends the job, brings the logs home and takes its cluster down. Waits until it has ended."""
    seen = probe(transport, remote_dir)
    if seen.state != DriveState.RUNNING or seen.pid is None:
        return seen
    # Signalled only while it is the driven run (the probe matched its arguments just now).
    transport.run(["kill", "-TERM", str(seen.pid)], check=False, timeout=60, what="stopping the driven run")
    say(f"waiting for {what} on {transport.label} to end: it stops the job and takes its cluster down "
        f"(up to {STOP_WAIT_S:.0f} s)")
    deadline = time.monotonic() + STOP_WAIT_S
    while seen.state == DriveState.RUNNING:
        if time.monotonic() > deadline:
            raise CloudtrainError(f"{what} on {transport.label} has not ended {STOP_WAIT_S:.0f} s after SIGTERM",
                                  hint=f"its log: {remote_dir}/driver.log on the host")
        sleep(POLL_S)
        seen = probe(transport, remote_dir)
    return seen


def _wait_for_run(transport, host: DriverHost, remote_dir: str) -> tuple[str, int]:  # noqa: ANN001
    deadline = time.monotonic() + START_WAIT_S
    while True:
        seen = probe(transport, remote_dir)
        if seen.runs and seen.pid is not None:
            return seen.runs[0], seen.pid
        if seen.state in (DriveState.ENDED, DriveState.GONE):
            tail = [line for line in log_tail(transport, remote_dir) if line.strip()]
            errors = [line for line in tail if line.startswith("error:")]
            said = errors[-1] if errors else tail[-1] if tail else "no output"
            code = seen.exit_code if seen.exit_code not in (None, 0) else 1
            raise DriverError(f"--driver {host.label}: `cloudtrain run` there ended before its run started "
                              f"(exit {seen.exit_code}): {said}", exit_code=code,
                              hint=f"its whole log: {remote_dir}/driver.log on the host")
        if time.monotonic() > deadline:
            raise CloudtrainError(f"--driver {host.label}: no run started within {START_WAIT_S:.0f} s",
                                  hint=f"read {remote_dir}/driver.log on the host; it may still start")
        time.sleep(POLL_S)
