#!/usr/bin/env bash
# Quick start, command 1: set up and train the bundled CNN on this machine through the full
# cloudtrain pipeline. Results land in runs/<run-id>/.
set -euo pipefail
cd "$(dirname "$0")/.."
echo "demo: 1. set up .venv with cloudtrain and TensorFlow (the first time: 2-5 minutes, then instant)"
echo "      2. cloudtrain run recipes/mnist-local.yaml: train the bundled MNIST CNN on this machine"
echo "         (about a minute on a laptop CPU); the last line printed is the run directory"
scripts/setup.sh
echo
echo "demo: .venv/bin/cloudtrain run recipes/mnist-local.yaml $*"
exec .venv/bin/cloudtrain run recipes/mnist-local.yaml "$@"
