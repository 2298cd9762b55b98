#!/usr/bin/env bash
# Quick start, command 1: set up and train the bundled CNN on this machine through the full
# cloudtrain pipeline. Results land in runs/<run-id>/.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/cloudtrain run recipes/mnist-local.yaml "$@"
