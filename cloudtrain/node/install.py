"""Installing the loop on the node: `ensure` (a new config written if it changed, the loop started
if none runs, surviving reboots where it can), `stop`, and the reboot hooks (a systemd user unit
with linger, else a cron @reboot line, else none and why). Standard library only.

`python3 watchdog.pyz ensure CONFIG` reads the new config on stdin; the CLI's installer
(cloudtrain/run/watchdog.py _BOOT) calls ensure() from the zipapp directly, with the secrets.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import time

from .files import read_json, read_text, running_pid, write_json
from .protocol import Paths, key_wants_delete
from .settings import comparable, stamp_lease
from .tell import sent_log, write_secrets


def unit_name(cfg: dict) -> str:
    return "cloudtrain-watchdog-{}.service".format(cfg.get("cluster", "cluster"))


def quiet(argv, timeout: float = 30) -> bool:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              timeout=timeout, check=False).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False


def output(argv, timeout: float = 30) -> str:
    try:
        return subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                              timeout=timeout, check=False).stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        return ""


def user_name() -> str:
    import pwd

    return pwd.getpwuid(os.getuid()).pw_name


def systemd_user_ready() -> tuple[bool, str]:
    """A systemd user manager that keeps running without a login (linger), so a unit survives reboots."""
    if not shutil.which("systemctl") or not quiet(["systemctl", "--user", "show-environment"]):
        return False, "no systemd user manager"
    user = user_name()
    if output(["loginctl", "show-user", user, "--property=Linger", "--value"]).strip() == "yes":
        return True, ""
    if quiet(["loginctl", "enable-linger"]) or quiet(["sudo", "-n", "loginctl", "enable-linger", user]):
        return True, ""
    # Without linger the user manager, and the unit with it, ends at logout.
    return False, "systemd user manager without linger (loginctl enable-linger refused)"


def install_systemd(paths: Paths, cfg: dict, python: str, program: str) -> bool:
    unit_dir = os.path.join(os.path.expanduser("~"), ".config", "systemd", "user")
    os.makedirs(unit_dir, exist_ok=True)
    unit = unit_name(cfg)
    text = (
        "[Unit]\nDescription=cloudtrain watchdog for cluster {} (autostop, budget)\n\n"
        "[Service]\nExecStart={} {} run {}\nRestart=on-failure\nRestartSec=10\n\n"
        "[Install]\nWantedBy=default.target\n"
    ).format(cfg.get("cluster", ""), shlex.quote(python), shlex.quote(program), shlex.quote(paths.config))
    with open(os.path.join(unit_dir, unit), "w", encoding="utf-8") as handle:
        handle.write(text)
    return quiet(["systemctl", "--user", "daemon-reload"]) and quiet(["systemctl", "--user", "enable", "--now", unit])


def cron_marker(paths: Paths) -> str:
    return f"# cloudtrain-watchdog {paths.config}"


def install_cron(paths: Paths, python: str, program: str) -> bool:
    if not shutil.which("crontab"):
        return False
    current = output(["crontab", "-l"])
    marker = cron_marker(paths)
    if marker in current:
        return True
    line = f"@reboot {shlex.quote(python)} {shlex.quote(program)} run {shlex.quote(paths.config)} >/dev/null 2>&1 {marker}\n"
    text = (current if current.endswith("\n") or not current else current + "\n") + line
    try:
        proc = subprocess.run(["crontab", "-"], input=text.encode(), stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0


def remove_hook(paths: Paths, hook=None, cfg=None) -> None:
    """Undo install_systemd / install_cron (the loop is ending for good). `hook` and `cfg`: what the
    loop read before its files were removed (`down` of a machine we do not own removes them)."""
    hook = read_text(paths.hook) if hook is None else hook
    cfg = (read_json(paths.config) or {}) if cfg is None else cfg
    if hook.startswith("systemd"):
        unit = unit_name(cfg)
        quiet(["systemctl", "--user", "disable", unit])
        try:
            os.unlink(os.path.join(os.path.expanduser("~"), ".config", "systemd", "user", unit))
        except OSError:
            pass
    elif hook.startswith("cron") and shutil.which("crontab"):
        current = output(["crontab", "-l"])
        marker = cron_marker(paths)
        if marker in current:
            kept = "".join(line for line in current.splitlines(True) if marker not in line)
            try:
                subprocess.run(["crontab", "-"], input=kept.encode(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL, timeout=30, check=False)
            except (OSError, subprocess.SubprocessError):
                pass
    try:
        os.unlink(paths.hook)
    except OSError:
        pass


def start_detached(paths: Paths, python: str, program: str) -> None:
    """setsid + no terminal, stdio to the log: it outlives the SSH session that started it."""
    with open(paths.log, "ab") as log:
        subprocess.Popen([python, program, "run", paths.config], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                         cwd=paths.root, start_new_session=True, close_fds=True)


def wait_running(paths: Paths, timeout: float = 10.0) -> int | None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pid = running_pid(paths)
        if pid is not None and pid > 0:
            return pid
        time.sleep(0.02)
    return running_pid(paths)


def power_off_refusal(cfg: dict) -> str:
    """Why this node could not power itself off when the watchdog acts, or "" when it can (or the
    action is no OS shutdown, or a stand-in replaces it). Not root: `shutdown` needs passwordless
    sudo, which images without it (or an admin's sudoers) do not give."""
    action = cfg.get("action") or {}
    enforces = cfg.get("autostop") or cfg.get("budget") or cfg.get("lease")
    if not enforces or action.get("kind") != "shutdown" or cfg.get("shutdown_command") or os.geteuid() == 0:
        return ""
    for probe in (["sudo", "-n", "true"], ["sudo", "-n", "-l", "shutdown"]):
        try:
            done = subprocess.run(probe, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError) as exc:
            last = f"{probe[0]}: {type(exc).__name__}: {exc}"
            continue
        if done.returncode == 0:
            return ""
        last = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
        last = last[0][:200]
    return (f"powering this node off needs passwordless sudo for {user_name()} (`sudo -n shutdown`), and "
            f"`sudo -n` says: {last}")


def ensure(config_path: str, new: dict, python: str, program: str, secrets=None) -> dict:
    """Write `new` if it changed and make sure a loop runs. `new` may lack its action (the CLI
    avoids a cloud call when the node already has the action for the same instance and effect):
    then the old one is kept, or {"status": "need-action"} comes back and nothing is written."""
    paths = Paths(config_path)
    os.makedirs(paths.root, exist_ok=True)
    old = read_json(paths.config)
    old = old if isinstance(old, dict) else {}
    for key in new.pop("keep", None) or ():
        # Settings this write does not own (e.g. `autostop` keeps the recipe's budget).
        if key in old:
            new[key] = old[key]
        else:
            new.setdefault(key, None)
    if new.get("lease"):
        # A machine under a lease is only ever deleted (on AWS one instance cannot both stop on one
        # shutdown and terminate on another): a write that keeps the lease (`cloudtrain autostop`)
        # must not turn its action into a stop.
        key = str(new.get("action_key") or "")
        if key.endswith(":stop"):
            new["action_key"] = key[: -len(":stop")] + ":delete"
            if (new.get("action") or {}).get("effect") != "delete":
                new["action"] = None
    if new.get("action") is None:
        if old.get("action") and old.get("action_key") == new.get("action_key"):
            new["action"] = old["action"]
        else:
            return {"status": "need-action", "down": key_wants_delete(new.get("action_key"))}
    if new.get("mark_key") and not new.get("mark"):
        # The liveness mark's call (or the provider's word that this machine cannot mark itself),
        # kept per instance like the action.
        if old.get("mark") and old.get("mark_key") == new["mark_key"]:
            new["mark"] = old["mark"]
        else:
            return {"status": "need-action", "down": key_wants_delete(new.get("action_key"))}
    refused = power_off_refusal(new)
    if refused:
        # Checked here, at `up`: otherwise autostop and budgets would silently never fire.
        return {"status": "refused", "why": refused}
    if new.get("count_ssh") and not new.get("ssh_port"):
        # This very command came in over SSH: $SSH_CONNECTION names the port sshd listens on here.
        fields = os.environ.get("SSH_CONNECTION", "").split()
        new["ssh_port"] = int(fields[3]) if len(fields) == 4 and fields[3].isdigit() else old.get("ssh_port")
    changed = comparable(old) != comparable(new)
    if changed:
        lease, before = new.get("lease"), old.get("lease")
        if isinstance(lease, dict):
            same = isinstance(before, dict) and comparable({"lease": before}) == comparable({"lease": lease})
            # The same lease (kept, or sent again with other changes) keeps the node's first reading.
            new["lease"] = dict(before) if same and "mono_until" in before else stamp_lease(lease)
        write_json(paths.config, new)
    write_secrets(paths, new, secrets or {})
    result = {"status": "written" if changed else "unchanged", "started": False, "hook": read_text(paths.hook) or "none",
              "ssh_port": new.get("ssh_port")}
    sent = sent_log(paths)
    if sent:
        result["sent"] = sent  # what this node told its targets: the CLI records it
    if not new.get("autostop") and not new.get("budget") and not new.get("lease"):
        pid = running_pid(paths)
        result.update(running=pid is not None, pid=pid)
        return result  # nothing to enforce: a running loop ends on its next tick
    pid = running_pid(paths)
    if pid is None:
        hook, why = "none", ""
        if new.get("persist", "auto") == "auto":
            ready, why = systemd_user_ready()
            if ready and install_systemd(paths, new, python, program):
                hook = f"systemd (user unit {unit_name(new)}, linger)"
            elif install_cron(paths, python, program):
                hook = "cron @reboot"
                why = ""
            else:
                why = (why + "; " if why else "") + "no crontab"
        else:
            why = "persist: none"
        with open(paths.hook, "w", encoding="utf-8") as handle:
            handle.write(hook + ("" if hook != "none" else f" ({why})") + "\n")
        if not hook.startswith("systemd") or wait_running(paths, 5.0) is None:
            start_detached(paths, python, program)
        pid = wait_running(paths)
        result.update(started=True, hook=read_text(paths.hook))
    result.update(running=pid is not None, pid=pid)
    return result


def stop(config_path: str) -> dict:
    paths = Paths(config_path)
    pid = running_pid(paths)
    if pid and pid > 0:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and running_pid(paths) is not None:
            time.sleep(0.05)
    remove_hook(paths)
    return {"stopped": pid is not None, "pid": pid}
