#!/usr/bin/env bash
# Configures (once) and builds pipert. Usage: scripts/build.sh [BUILD_DIR [meson options...]]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
if [ ! -f "$dir/build.ninja" ]; then
  meson setup "$dir" "$@"
elif [ $# -gt 0 ]; then
  meson configure "$dir" "$@"   # an existing build takes the options given now
fi
ninja -C "$dir"
