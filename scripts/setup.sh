#!/usr/bin/env bash
# Creates .venv and installs cloudtrain with the extras this checkout needs. Idempotent and quick on
# a second run: it reinstalls only when pyproject.toml changed.
#   scripts/setup.sh            runtime + TensorFlow (for the local MNIST recipe)
#   scripts/setup.sh --test     also the test dependencies and the apt packages the tests use
set -euo pipefail
cd "$(dirname "$0")/.."

want_test=0
[ "${1:-}" = "--test" ] && want_test=1

PYTHON=${PYTHON:-python3}
# 3.11.4 brought tarfile's 'data' extraction filter, which cloudtrain unpacks results with.
if ! "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11, 4))' 2>/dev/null; then
    have=$("$PYTHON" -c 'import platform; print(platform.python_version())' 2>/dev/null || echo "not runnable")
    echo "cloudtrain needs Python 3.11.4 or newer ($PYTHON is $have); set PYTHON=/path/to/python3 (3.11.4+)" >&2
    exit 2
fi

if [ "$want_test" = 1 ]; then
    missing=()
    [ -x /usr/sbin/sshd ] || missing+=(openssh-server)
    command -v rsync >/dev/null || missing+=(rsync)
    command -v ssh >/dev/null || missing+=(openssh-client)
    # Nodes that look like fresh cloud images (cloudtrain/testing/rootfs.py) build a Debian rootfs
    # with Debian's own tool; they need root, so only root installs it.
    [ "$(id -u)" = 0 ] && ! command -v mmdebstrap >/dev/null && missing+=(mmdebstrap)
    # A real Slurm for the slurm backend's tests (cloudtrain/testing/slurm.py): controller, nodes, munge.
    command -v slurmctld >/dev/null || [ -x /usr/sbin/slurmctld ] || missing+=(slurm-wlm)
    command -v munged >/dev/null || [ -x /usr/sbin/munged ] || missing+=(munge)
    # Node.js for Azurite, the Azure Blob emulator of the Blob tests (cloudtrain/testing/blob.py).
    command -v npm >/dev/null || missing+=(nodejs npm)
    # A real browser for the HTML report's test (tests/report): Debian's chromium and its driver.
    command -v chromium >/dev/null || missing+=(chromium)
    command -v chromedriver >/dev/null || missing+=(chromium-driver)
    # A real PostgreSQL for the shared-state tests (cloudtrain/testing/postgres.py): Debian's server binaries.
    ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || missing+=(postgresql)
    if [ ${#missing[@]} -gt 0 ]; then
        SUDO=""
        [ "$(id -u)" = 0 ] || SUDO="sudo"
        echo "installing apt packages: ${missing[*]}"
        $SUDO apt-get update -qq
        DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
    fi
    # Azurite into this checkout (.venv/azurite, where the test kit looks), never npm's global prefix.
    azurite_version=3.37.0
    if ! grep -qs "\"version\": \"$azurite_version\"" .venv/azurite/node_modules/azurite/package.json; then
        echo "setup: installing azurite $azurite_version (npm) into .venv/azurite"
        npm install --silent --no-audit --no-fund --prefix .venv/azurite "azurite@$azurite_version" >/dev/null
    fi
fi

extras="tf,ssh,aws,sweep"
[ "$want_test" = 1 ] && extras="$extras,dev"
stamp=".venv/.cloudtrain-$(sha256sum pyproject.toml | cut -c1-16)-$extras"
if [ -f "$stamp" ]; then
    echo "setup: .venv is up to date (cloudtrain[$extras]; pyproject.toml unchanged)"
    exit 0
fi

# One line per step, then pip's own progress: the first install downloads TensorFlow and takes a while.
started=$SECONDS
if [ ! -x .venv/bin/python ]; then
    echo "setup: creating .venv with $PYTHON ($("$PYTHON" -c 'import platform; print(platform.python_version())'))"
    "$PYTHON" -m venv .venv
fi
# uv installs from the indexes, links, constraints and certificate pip is configured with (pip's
# config files and PIP_* variables, read through `pip config`), in ~20 s where pip takes ~2 min;
# pip itself is the fallback wherever uv cannot be had or fails.
uv_args() {
    .venv/bin/python - <<'PY'
import os, subprocess
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint"}
found = {}
listing = subprocess.run([".venv/bin/python", "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
for line in listing.splitlines():
    key, _, value = line.partition("=")
    name = key.rpartition(".")[2]
    if name in flags or name == "cert":
        found[name] = value.strip().strip("'\"")  # later lines (the environment's) win, as in pip
for name, flag in flags.items():
    for value in found.get(name, "").split():
        path = value[len("file://"):] if value.startswith("file://") else value
        if "://" in value and not value.startswith("file://") or os.path.exists(path):
            print(flag)
            print(value)
if found.get("cert") and not os.environ.get("SSL_CERT_FILE"):
    print("--cert")
    print(found["cert"])
PY
}
installed=0
echo "setup: installing cloudtrain[$extras] and its dependencies (uv, with pip's settings); the first"
echo "       time this downloads TensorFlow (about 600 MB with its libraries)"
if .venv/bin/python -m pip install -q uv 2>/dev/null; then
    mapfile -t args < <(uv_args)
    uv=()
    cert=()
    for ((i = 0; i < ${#args[@]}; i += 2)); do
        if [ "${args[i]}" = "--cert" ]; then cert=(env "SSL_CERT_FILE=${args[i + 1]}"); else uv+=("${args[i]}" "${args[i + 1]}"); fi
    done
    if "${cert[@]}" .venv/bin/uv pip install --python .venv/bin/python --index-strategy unsafe-best-match \
            "${uv[@]}" -e ".[$extras]"; then
        installed=1
    else
        echo "setup: uv could not install it (above); pip does it instead"
    fi
fi
if [ "$installed" = 0 ]; then
    echo "setup: upgrading pip in .venv"
    .venv/bin/python -m pip install -q --upgrade pip
    echo "setup: installing with pip: 2-5 minutes the first time; pip's progress follows"
    .venv/bin/python -m pip install --progress-bar on -e ".[$extras]"
fi
touch "$stamp"
echo "setup: done in $((SECONDS - started)) s; the next run skips this step until pyproject.toml changes"
