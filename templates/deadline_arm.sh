#!/bin/sh
# cloudtrain: this Azure VM's deadline, given in its launch request (custom data), run once by
# cloud-init at first boot. An OS shutdown would leave an Azure VM "Stopped (allocated)" and still
# billed, so at its deadline the machine deallocates (or deletes) itself through ARM with its own
# managed identity's token from IMDS: the same call its watchdog makes (the watchdog, once
# installed, enforces the same limit first and across stop/start; this is the backstop for a VM
# whose cloudtrain died before installing it). No user credentials are on the machine.
# If ARM refuses (the identity's role was never granted: the launch was cut short), it shuts the
# OS down after its retries: the job stops, and `cloudtrain cost`/`gc` show the VM still allocated.
CLOUDTRAIN_DEADLINE_S=__DEADLINE_S__
CLOUDTRAIN_DEADLINE_ACTION='__ACTION_JSON__'
umask 077
mkdir -p /var/lib/cloudtrain
printf '%s\n' "$CLOUDTRAIN_DEADLINE_ACTION" > /var/lib/cloudtrain/deadline-action.json
cat > /var/lib/cloudtrain/deadline.py <<'PY'
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request

with open("/var/lib/cloudtrain/deadline-action.json") as handle:
    action = json.load(handle)
token_spec = action["token"]
for attempt in range(10):
    try:
        ask = urllib.request.Request(token_spec["url"], headers=token_spec["headers"])
        with urllib.request.urlopen(ask, timeout=10) as answer:
            token = json.load(answer)[token_spec["field"]]
        call = urllib.request.Request(action["url"], method=action["method"],
                                      headers={"Authorization": "Bearer " + token})
        with urllib.request.urlopen(call, timeout=60) as answer:
            if answer.status in action["ok"]:
                sys.exit(0)
            print(f"cloudtrain deadline: ARM answered {answer.status}", file=sys.stderr)
    except urllib.error.HTTPError as exc:
        if exc.code == 404 and action.get("gone_ok"):
            sys.exit(0)
        print(f"cloudtrain deadline: ARM refused ({exc.code}), attempt {attempt + 1}", file=sys.stderr)
    except (OSError, ValueError, KeyError) as exc:
        print(f"cloudtrain deadline: {exc}, attempt {attempt + 1}", file=sys.stderr)
    time.sleep(30)
subprocess.call(["shutdown", "-h", "now"])
PY
if command -v systemd-run >/dev/null 2>&1; then
    systemd-run --unit=cloudtrain-deadline --on-active="${CLOUDTRAIN_DEADLINE_S}s" \
        /usr/bin/python3 /var/lib/cloudtrain/deadline.py && exit 0
fi
# Without systemd: a detached sleeper, so cloud-init's final stage is not held up.
nohup sh -c "sleep $CLOUDTRAIN_DEADLINE_S; exec python3 /var/lib/cloudtrain/deadline.py" >/dev/null 2>&1 &
