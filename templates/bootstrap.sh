#!/bin/sh
# cloudtrain bootstrap: runs on a fresh VM at the first `up`, as the login user (no root needed).
#
#   bootstrap.sh                        report what the VM has, as one JSON line on stdout
#   bootstrap.sh --venv [--pip]         also make the node's venv, where setup and run run (--pip: with
#                                       a `pip` that installs into it)
#   bootstrap.sh --ensure-tf            also make sure a TensorFlow that fits this VM imports (implies --venv)
#   bootstrap.sh --ensure-tf --dry-run  decide and report what would be installed; install nothing
#   --log FILE                          every step's output, appended (default ~/.cloudtrain/bootstrap.log)
#
# The report: GPUs and driver from nvidia-smi, the CUDA version the driver supports, python3's
# version, the TensorFlow that imports (if any), the package chosen and what this run installed.
#
# The choice is made from the VM itself: `tensorflow[and-cuda]` (CUDA libraries from pip) when
# nvidia-smi works, i.e. a driver is loaded; `tensorflow-cpu` otherwise (`tensorflow` on aarch64,
# where no -cpu wheel exists). Idempotent: when TensorFlow already imports, nothing is installed.
# TensorFlow goes into a venv under ~/.cloudtrain/venv that also sees the system's packages: no
# root, and no fight with a distro Python that refuses `pip install` (PEP 668). The recipe's setup
# and run run inside that venv too (runner.sh activates it: its `.cloudtrain` marker), so their
# `pip install` works on Debian 12 / Ubuntu 24.04 and preinstalled frameworks stay visible: the
# base interpreter's own site-packages (an image's conda or venv python) through a .pth file, the
# system's through --system-site-packages.
#
# A failing step says why: its last lines go to stderr under the failure line, and every step's
# whole output is kept in the log file.
#
# Environment, for unusual images and for tests:
#   CLOUDTRAIN_PYTHON       base interpreter (default: python3)
#   CLOUDTRAIN_VENV         the venv (default: $HOME/.cloudtrain/venv)
#   CLOUDTRAIN_TF_VERSION   version pin appended to the package, e.g. "==2.16.*"
#   CLOUDTRAIN_GET_PIP_URL  where get-pip.py comes from when the venv has no pip (default bootstrap.pypa.io)
#   CLOUDTRAIN_PIP_INSTALL  installer command; the package is appended as one argument.
#                           Default: VENV/bin/python -m pip install --quiet. The command sees
#                           CLOUDTRAIN_TARGET_PYTHON, the interpreter that must import TensorFlow.
# Progress and errors go to stderr. Exit codes: 0 ok, 2 usage, 3 no python3, 4 venv or pip
# unavailable, 5 installed but TensorFlow still does not import.
set -u

usage() { sed -n '2,6p' "$0" | sed 's/^# \{0,1\}//'; }

ensure=0
dry_run=0
want_venv=0
want_pip=0
log=${HOME}/.cloudtrain/bootstrap.log
while [ $# -gt 0 ]; do
    case "$1" in
    --ensure-tf) ensure=1 ;;
    --dry-run) dry_run=1 ;;
    --venv) want_venv=1 ;;
    --pip) want_venv=1; want_pip=1 ;;
    --log) [ $# -ge 2 ] || { echo "bootstrap: --log needs a file" >&2; exit 2; }; log=$2; shift ;;
    -h | --help) usage; exit 0 ;;
    *) echo "bootstrap: unknown option $1" >&2; usage >&2; exit 2 ;;
    esac
    shift
done
[ "$ensure" = 1 ] && [ "$dry_run" = 0 ] && want_venv=1

say() { echo "bootstrap: $*" >&2; }

# step WHAT CMD...: run CMD with its output appended to the log; on failure say so with the last
# lines of that output (pip's own reason: no network, a certificate, no wheel for this Python).
step() {
    what=$1
    shift
    mkdir -p "$(dirname "$log")" 2>/dev/null
    out="$log.step.$$"
    echo "=== $(date -u +%Y-%m-%dT%H:%M:%SZ) $what: $*" >>"$log" 2>/dev/null
    "$@" >"$out" 2>&1
    code=$?
    cat "$out" >>"$log" 2>/dev/null
    if [ "$code" != 0 ]; then
        say "$what failed (exit $code); its last lines (all of it: $log):"
        tail -n 15 "$out" | sed 's/^/  | /' >&2
    fi
    rm -f "$out"
    return "$code"
}

base_python=${CLOUDTRAIN_PYTHON:-python3}
if ! command -v "$base_python" >/dev/null 2>&1; then
    say "$base_python not found; cloudtrain needs python3 on the VM"
    exit 3
fi
venv=${CLOUDTRAIN_VENV:-$HOME/.cloudtrain/venv}

# --- what the VM has -------------------------------------------------------------------------
smi_status=absent
smi_query=
cuda=
if command -v nvidia-smi >/dev/null 2>&1; then
    # A GPU image without a loaded driver still has nvidia-smi; it fails. Only a working one counts.
    if smi_query=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null) &&
        [ -n "$smi_query" ]; then
        smi_status=ok
        cuda=$(nvidia-smi 2>/dev/null | sed -n 's/.*CUDA Version: *\([0-9][0-9.]*\).*/\1/p' | head -n 1)
    else
        smi_status=failed
        smi_query=
    fi
fi
arch=$(uname -m)

if [ "$smi_status" = ok ]; then
    package="tensorflow[and-cuda]"
elif [ "$arch" = aarch64 ] || [ "$arch" = arm64 ]; then
    package="tensorflow"
else
    package="tensorflow-cpu"
fi
package="$package${CLOUDTRAIN_TF_VERSION:-}"

tf_version() {
    # Prints the version if TensorFlow imports with interpreter $1, nothing otherwise.
    TF_CPP_MIN_LOG_LEVEL=3 "$1" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null | tail -n 1
}

python=$base_python
[ -x "$venv/bin/python" ] && python=$venv/bin/python
# Importing TensorFlow takes seconds: ask only when the job needs it (a shell job does not).
tf_before=
[ "$ensure" = 1 ] && tf_before=$(tf_version "$python")

# --- ensure TensorFlow -----------------------------------------------------------------------
ensure_venv() {
    if [ ! -x "$venv/bin/python" ]; then
        mkdir -p "$(dirname "$venv")" || exit 4
        # --without-pip: Debian/Ubuntu strip ensurepip from the system Python; pip comes later.
        if ! step "creating the venv $venv" "$base_python" -m venv --system-site-packages --without-pip "$venv"; then
            say "cannot create a venv at $venv with $base_python"
            exit 4
        fi
    fi
    python=$venv/bin/python
    # --system-site-packages reaches the base installation only: when $base_python is itself a venv
    # or a conda env (an image's framework python), its packages stay visible through a .pth file.
    site=$("$python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])') || exit 4
    "$base_python" -c 'import site
for p in site.getsitepackages(): print(p)' >"$site/_cloudtrain_base.pth" 2>/dev/null || rm -f "$site/_cloudtrain_base.pth"
    : >"$venv/.cloudtrain" # runner.sh runs setup and run inside a venv carrying this marker
}

ensure_pip() {
    if "$python" -m pip --version >/dev/null 2>&1; then
        # pip imports (the venv's own, or the base's through the venv's paths): a `pip` command in
        # the venv that runs it with the venv's python installs into the venv, never the system.
        for name in pip pip3; do
            [ -e "$venv/bin/$name" ] && continue
            printf '#!/bin/sh\nexec "%s" -m pip "$@"\n' "$venv/bin/python" >"$venv/bin/$name" && chmod 755 "$venv/bin/$name"
        done
        return 0
    fi
    step "installing pip with ensurepip" "$python" -m ensurepip --default-pip && return 0
    url=${CLOUDTRAIN_GET_PIP_URL:-https://bootstrap.pypa.io/get-pip.py}
    if step "fetching get-pip.py from $url" "$python" -c 'import sys, urllib.request
open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1], timeout=120).read())' "$url" "$venv/get-pip.py" &&
        step "installing pip from get-pip.py" "$python" "$venv/get-pip.py" --quiet; then
        return 0
    fi
    say "could not install pip into $venv"
    exit 4
}

installed=
would_install=
tf_after=$tf_before # importing TensorFlow takes seconds: only ask again when something changed
if [ "$want_venv" = 1 ]; then
    ensure_venv
    [ "$want_pip" = 1 ] && ensure_pip
fi
if [ "$ensure" = 1 ] && [ -z "$tf_before" ]; then
    if [ "$dry_run" = 1 ]; then
        would_install=$package
    else
        ensure_venv
        # The venv sees system packages: an image with TensorFlow preinstalled needs nothing.
        tf_after=$(tf_version "$python")
        if [ -z "$tf_after" ]; then
            say "installing $package for $python"
            if [ -n "${CLOUDTRAIN_PIP_INSTALL:-}" ]; then
                CLOUDTRAIN_TARGET_PYTHON=$python
                export CLOUDTRAIN_TARGET_PYTHON
                step "installing $package" sh -c "$CLOUDTRAIN_PIP_INSTALL \"\$1\"" sh "$package"
            else
                ensure_pip
                step "installing $package" "$python" -m pip install --disable-pip-version-check "$package"
            fi || { say "installing $package failed"; exit 4; }
            installed=$package
            tf_after=$(tf_version "$python")
        fi
    fi
fi

# --- report: one JSON line, built by Python so every string is escaped properly --------------
CT_SMI_STATUS=$smi_status CT_SMI_QUERY=$smi_query CT_CUDA=$cuda CT_ARCH=$arch CT_PACKAGE=$package \
    CT_TF_BEFORE=$tf_before CT_TF=$tf_after CT_INSTALLED=$installed CT_WOULD=$would_install \
    CT_PYTHON=$python CT_ENSURE=$ensure CT_VENV=$([ "$python" = "$venv/bin/python" ] && echo "$venv") \
    CT_PIP=$([ -x "$venv/bin/pip" ] && [ "$python" = "$venv/bin/python" ] && echo 1) CT_LOG=$log "$base_python" -c '
import json, os, platform
env = os.environ
gpus = []
for line in env["CT_SMI_QUERY"].splitlines():
    parts = [p.strip() for p in line.split(",")]
    if parts and parts[0]:
        gpus.append({"name": parts[0], "driver": parts[1] if len(parts) > 1 else None,
                     "memory": parts[2] if len(parts) > 2 else None})
print(json.dumps({
    "gpu": bool(gpus),
    "gpu_count": len(gpus),
    "gpus": gpus,
    "nvidia_smi": env["CT_SMI_STATUS"],
    "driver_version": gpus[0]["driver"] if gpus else None,
    "cuda_version": env["CT_CUDA"] or None,
    "arch": env["CT_ARCH"],
    "python_version": platform.python_version(),
    "python": env["CT_PYTHON"],
    "tf_package": env["CT_PACKAGE"],
    "tensorflow": env["CT_TF"] or None,
    "installed": env["CT_INSTALLED"] or None,
    "would_install": env["CT_WOULD"] or None,
    "venv": env["CT_VENV"] or None,
    "pip": bool(env["CT_PIP"]),
    "log": env["CT_LOG"],
}, sort_keys=True))
'

if [ "$ensure" = 1 ] && [ "$dry_run" = 0 ] && [ -z "$tf_after" ]; then
    say "TensorFlow still does not import with $python"
    exit 5
fi
exit 0
