#!/usr/bin/env bash
# Quick start, command 2: set up (venv, test dependencies, openssh-server, rsync) and run every test.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --test
exec .venv/bin/python -m pytest "$@"
