#!/usr/bin/env bash
# Quick start, command 2: set up (venv, test dependencies, openssh-server, rsync) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# Two workers: most tests wait on sshd, fake clouds and watchdog ticks, so two halve the wall time
# on a 2-core machine (26.8 -> 15.7 min measured). CLOUDTRAIN_TEST_WORKERS=0 runs in one process.
# `scripts/test.sh -m quick` runs only the edit-loop tier (docs/testing.md); CI runs everything.
# Bytecode is cached: with PYTHONDONTWRITEBYTECODE (set on some images) every worker re-rewrote every
# test module's asserts at collection (~10 s of CPU each) and every CLI subprocess compiled the
# cloudtrain modules without a .pyc again. __pycache__ is git-ignored.
unset PYTHONDONTWRITEBYTECODE
# The fresh-image nodes' Debian rootfs (cloudtrain/testing/rootfs.py) is built once per checkout,
# not once per test worker (~50 s each); .venv/ is git-ignored.
export CLOUDTRAIN_TEST_ROOTFS_CACHE="${CLOUDTRAIN_TEST_ROOTFS_CACHE:-$PWD/.venv/rootfs-cache}"
.venv/bin/python -m compileall -q cloudtrain >/dev/null
exec .venv/bin/python -m pytest -n "${CLOUDTRAIN_TEST_WORKERS:-2}" --dist worksteal "$@"
