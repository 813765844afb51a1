#!/bin/sh
# The `pipert` command with every job on another kernel table: the command
# tests run through this when meson's test_device option is not "cpu"
# (scripts/test.sh runs the sanitizer build's with cpu-guarded, whose tensors
# the host cannot read outside kernel calls). It adds --runtime.device after
# the subcommands that run a job; a --runtime.device the test gives itself
# comes later and wins. exec: the test's pid is pipert's.
bin=${PIPERT_TEST_REAL_BIN:?PIPERT_TEST_REAL_BIN is not set}
device=${PIPERT_TEST_DEVICE:?PIPERT_TEST_DEVICE is not set}
case "$1" in
  launch|worker|train) command=$1; shift; exec "$bin" "$command" --runtime.device="$device" "$@" ;;
  *) exec "$bin" "$@" ;;
esac
