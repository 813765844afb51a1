#!/usr/bin/env bash
# The churn test bed (scripts/churn.py: what it injects, reports and checks). Needs root.
#   scripts/churn.sh [--minutes 10] [--methods sparse,streaming-diloco] [--build build] ...
#   scripts/churn.sh --short [--build build]   the CI form: 3 minutes of sparse, checked
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --short ]; then
  shift
  exec python3 scripts/churn.py --minutes 3 --methods sparse --gap 3 --at-least 2 --no-reference \
    --stop-when-recovered --check --out "${CHURN_OUT:-runs/churn-short}" "$@"
fi
exec python3 scripts/churn.py "$@"
