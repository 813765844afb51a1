#!/usr/bin/env bash
# Quick start, step 1: install the dependencies, build, and run the main job on
# its embedded default (a small GPT trained on the fortunes corpus).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
out=${PIPERT_OUT:-runs/quickstart}
rm -rf "$out"
./build/tools/pipert train --out "$out"
