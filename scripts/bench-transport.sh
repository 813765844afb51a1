#!/usr/bin/env bash
# pipert's transport against ucx_perftest between two processes on this host,
# measured in the same run: bandwidth of 4 MiB messages and latency (half a
# round trip) of 8-byte messages. For each UCX_TLS setting, REPS rounds run
# interleaved (ucx_perftest tag_bw, ucx_perftest tag_lat, pipert's
# bench_transport), so that load from elsewhere hits all of them alike; it
# prints every round, the medians and the ratios pipert / ucx_perftest.
#
# ucx_perftest runs as its defaults have it (no error handling). pipert's
# endpoints use UCX peer error handling, with which UCX 1.13 refuses its
# shared-memory transports; "ucx_perftest -e" (same error handling as pipert)
# is measured as well, to show what UCX itself reaches in that mode.
#
# Usage: scripts/bench-transport.sh [--reps N] [--build DIR] [--tls "default tcp ..."]
#   --reps N     rounds per UCX_TLS setting (5)
#   --build DIR  the build directory holding tests/bench_transport (build)
#   --tls LIST   UCX_TLS settings, "default" meaning unset ("default tcp")
set -euo pipefail
cd "$(dirname "$0")/.."

reps=5
build=build
tls_list="default tcp"
while (($#)); do
  case "$1" in
    --reps) reps=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --tls) tls_list=$2; shift 2 ;;
    *) echo "usage: $0 [--reps N] [--build DIR] [--tls \"default tcp ...\"]" >&2; exit 2 ;;
  esac
done

bench=$build/tests/bench_transport
[[ -x $bench ]] || { echo "$0: $bench not found: build first (ninja -C $build)" >&2; exit 1; }
command -v ucx_perftest >/dev/null || { echo "$0: ucx_perftest not found (ucx-utils)" >&2; exit 1; }

LARGE=4194304        # bytes per bandwidth message
BW_ITERS=100         # 4 MiB messages per bandwidth run (both tools)
LAT_ITERS=10000      # ucx_perftest ping-pongs per latency run
PINGS=2000           # pipert ping-pongs per latency run

server=""            # the ucx_perftest server we started and have not reaped yet
cleanup() {
  if [[ -n $server ]]; then kill "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# perftest ARGS...: runs a server and a client on a free port; prints the client's "Final:" line.
perftest() {
  local port out tries
  port=$(free_port)
  ucx_perftest "$@" -p "$port" >/dev/null 2>&1 &
  server=$!
  trap cleanup EXIT   # this runs in a $(...) subshell, which does not inherit the script's trap
  out=""
  for ((tries = 0; tries < 50; tries++)); do   # until the server listens (at most ~5 s)
    if out=$(ucx_perftest 127.0.0.1 "$@" -p "$port" 2>&1); then break; fi
    out=""
    kill -0 "$server" 2>/dev/null || break
    sleep 0.1
  done
  # A server whose client never came does not end by itself.
  if [[ -z $out ]]; then kill "$server" 2>/dev/null || true; fi
  wait "$server" 2>/dev/null || true
  server=""
  grep '^Final:' <<<"$out" || { echo "$0: ucx_perftest $* failed" >&2; return 1; }
}

# Overall bandwidth (MB/s, MB = 2^20 bytes in ucx_perftest) in GB/s (10^9 bytes).
perftest_bw() { perftest -t tag_bw -s "$LARGE" -n "$BW_ITERS" -w 10 "$@" | awk '{ printf "%.3f", $7 * 1048576 / 1e9 }'; }
# Overall average latency in us; ucx_perftest reports half a round trip for ping-pong tests.
perftest_lat() { perftest -t tag_lat -s 8 -n "$LAT_ITERS" -w 1000 "$@" | awk '{ printf "%.3f", $5 }'; }

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { printf "%.3f", NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f%%", 100 * a / b }'; }
times() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1fx", a / b }'; }

echo "pipert transport vs ucx_perftest, 2 processes on $(hostname), $(nproc) cores, UCX $(ucx_info -v | awk '/Version/ { print $3; exit }')"
echo "bandwidth: $BW_ITERS x 4 MiB tag messages; latency: 8-byte ping-pong, half round trip"
echo "  ucx_perftest -t tag_bw -s $LARGE -n $BW_ITERS -w 10    ucx_perftest -t tag_lat -s 8 -n $LAT_ITERS -w 1000"
echo "  $bench --runs 1 --messages $BW_ITERS --pings $PINGS"
echo "  (\"perftest -e\": ucx_perftest with endpoint error handling, the mode pipert's endpoints use)"
for tls in $tls_list; do
  if [[ $tls == default ]]; then unset UCX_TLS; else export UCX_TLS=$tls; fi
  echo
  echo "UCX_TLS=${UCX_TLS:-(unset)}"
  printf '  %-5s %14s %14s %14s   %14s %14s %14s\n' round "perftest GB/s" "perftest -e" "pipert GB/s" "perftest us" "perftest -e" "pipert us"
  p_bw=() e_bw=() x_bw=() p_lat=() e_lat=() x_lat=()
  for ((r = 1; r <= reps; r++)); do
    p_bw+=("$(perftest_bw)")
    e_bw+=("$(perftest_bw -e)")
    p_lat+=("$(perftest_lat)")
    e_lat+=("$(perftest_lat -e)")
    out=$("$bench" --runs 1 --messages "$BW_ITERS" --pings "$PINGS")
    x_bw+=("$(awk '/bandwidth/ { for (i = 1; i <= NF; i++) if ($i == "GB/s") { print $(i - 1); exit } }' <<<"$out")")
    x_lat+=("$(awk '/latency/ { for (i = 1; i <= NF; i++) if ($i == "us") { print $(i - 1); exit } }' <<<"$out")")
    printf '  %-5s %14s %14s %14s   %14s %14s %14s\n' "$r" "${p_bw[-1]}" "${e_bw[-1]}" "${x_bw[-1]}" "${p_lat[-1]}" "${e_lat[-1]}" "${x_lat[-1]}"
  done
  mp_bw=$(echo "${p_bw[*]}" | median); me_bw=$(echo "${e_bw[*]}" | median); mx_bw=$(echo "${x_bw[*]}" | median)
  mp_lat=$(echo "${p_lat[*]}" | median); me_lat=$(echo "${e_lat[*]}" | median); mx_lat=$(echo "${x_lat[*]}" | median)
  printf '  %-5s %14s %14s %14s   %14s %14s %14s\n' median "$mp_bw" "$me_bw" "$mx_bw" "$mp_lat" "$me_lat" "$mx_lat"
  echo "  bandwidth: pipert / ucx_perftest = $(ratio "$mx_bw" "$mp_bw")   (pipert / ucx_perftest -e = $(ratio "$mx_bw" "$me_bw"))"
  echo "  latency:   pipert = $(times "$mx_lat" "$mp_lat") ucx_perftest's   ($(times "$mx_lat" "$me_lat") ucx_perftest -e's)"
done
