#!/usr/bin/env bash
# Quick start, step 2: the whole test suite, in a release build and in a build
# with AddressSanitizer and UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
scripts/build.sh build
meson test -C build --print-errorlogs
scripts/build.sh build-sanitize -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  meson test -C build-sanitize --print-errorlogs --timeout-multiplier 4
