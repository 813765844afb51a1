#!/usr/bin/env bash
# Builds the libFuzzer harnesses of fuzz/ with clang, AddressSanitizer and
# UBSan (build-fuzz), then runs each one. Crashes are written to
# build-fuzz/crashes/NAME/; new inputs go to a scratch copy of the corpus
# (fuzz/corpus/ changes only when you copy a regression input there).
#   scripts/fuzz.sh                    every harness for 60 s
#   scripts/fuzz.sh -t 3               every harness for 3 s (scripts/test.sh)
#   scripts/fuzz.sh -r 1000000 config  one harness for a million executions
# Options: -t SECONDS (default 60), -r RUNS (then no time limit),
# -b BUILD_DIR (default build-fuzz); names after the
# options pick harnesses (default: all in fuzz/meson.build).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=60 runs=-1 dir=build-fuzz
while getopts "t:r:b:" opt; do
  case $opt in
    t) seconds=$OPTARG ;;
    r) runs=$OPTARG; seconds=0 ;;
    b) dir=$OPTARG ;;
    *) exit 2 ;;
  esac
done
shift $((OPTIND - 1))
if [ $# -gt 0 ]; then
  names=("$@")
else
  mapfile -t names < <(sed -n "s/^fuzz_harnesses = \[\(.*\)\]/\1/p" fuzz/meson.build | tr -d "' " | tr , '\n')
fi
if [ ! -f "$dir/build.ninja" ]; then
  CC=clang meson setup "$dir" -Dfuzz=true -Dtests=false -Dcuda=disabled -Dnative=false \
    -Dbuildtype=debugoptimized -Db_sanitize=address,undefined -Db_lundef=false >/dev/null
fi
targets=()
for name in "${names[@]}"; do targets+=("fuzz/fuzz_$name"); done
ninja -C "$dir" "${targets[@]}"

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
status=0
for name in "${names[@]}"; do
  scratch="$dir/corpus/$name" crashes="$dir/crashes/$name"
  mkdir -p "$scratch" "$crashes"
  cp -n fuzz/corpus/"$name"/* "$scratch"/ 2>/dev/null || true
  dict=()
  if [ -f fuzz/"$name".dict ]; then dict=(-dict=fuzz/"$name".dict); fi
  echo "fuzz: $name (${seconds}s, runs $runs)"
  if ! "$dir/fuzz/fuzz_$name" "${dict[@]}" -max_len=8192 -max_total_time="$seconds" -runs="$runs" \
      -artifact_prefix="$crashes/" -print_final_stats=1 "$scratch" 2>"$dir/fuzz-$name.log"; then
    tail -n 60 "$dir/fuzz-$name.log" >&2
    echo "fuzz: $name FAILED; the input is in $crashes/ (keep it in fuzz/corpus/$name/)" >&2
    status=1
  fi
  grep -E "^#[0-9]+[[:space:]]+DONE" "$dir/fuzz-$name.log" | tail -n 1 || true
done
exit $status
