#!/usr/bin/env bash
# Quick start, step 1: install the dependencies, build, and run the main job on
# its embedded default: a small GPT trained on the fortunes corpus by an
# asynchronous 2-stage pipeline (async 1F1B with the Nesterov look-ahead), one
# worker per core. It ends with the validation loss and where the metrics and
# the trace are.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
out=${PIPERT_OUT:-runs/quickstart}
rm -rf "$out"
./build/tools/pipert launch --stages 2 --replicas 1 --out "$out"
