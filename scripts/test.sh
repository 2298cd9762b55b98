#!/usr/bin/env bash
# Quick start, command 2: set up (venv, test dependencies, openssh-server, rsync) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
# Six workers on two cores: with the CLI forked from a server that has imported it
# (cloudtrain/testing/forkcli.py), most tests wait on sshd, fake clouds, watchdog ticks and real
# billing minutes, not on the CPU (clean clone beside a CPU burner: 4 workers 28.4 min, 6: 13-13.5 min
# of tests; the suite's CPU is ~1,300 s, so two cores bound it near 11 min).
# `--dist load --maxschedchunk 1` hands each worker the next test as it finishes one (by default
# each worker gets a quarter of its share up front: with the longest first, one worker's chunk of
# e2e tests was the run's last 5 minutes); the longest start first (tests/conftest.py).
# CLOUDTRAIN_TEST_WORKERS=0 runs in one process.
# `scripts/test.sh -m quick` runs only the edit-loop tier (docs/testing.md); CI runs everything.
# Bytecode is cached: with PYTHONDONTWRITEBYTECODE (set on some images) every worker re-rewrote every
# test module's asserts at collection (~10 s of CPU each) and every CLI subprocess compiled the
# cloudtrain modules without a .pyc again. __pycache__ is git-ignored.
unset PYTHONDONTWRITEBYTECODE
# The fresh-image nodes' Debian rootfs (cloudtrain/testing/rootfs.py) is built once per checkout,
# not once per test worker (~50 s each); .venv/ is git-ignored.
export CLOUDTRAIN_TEST_ROOTFS_CACHE="${CLOUDTRAIN_TEST_ROOTFS_CACHE:-$PWD/.venv/rootfs-cache}"
.venv/bin/python -m compileall -q cloudtrain >/dev/null
# One collection first writes the test modules' assertion-rewritten bytecode once; otherwise each
# worker of a fresh checkout rewrites every test module itself (six times the CPU). Its errors, if
# any, are the run's own and are reported by it.
.venv/bin/python -m pytest --collect-only -q -p no:xdist "$@" >/dev/null 2>&1 || true
exec .venv/bin/python -m pytest -n "${CLOUDTRAIN_TEST_WORKERS:-6}" --dist load --maxschedchunk 1 "$@"
