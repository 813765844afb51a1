# Shell helpers the benchmark scripts share (sourced, not run).

# The median of the numbers on standard input, one per line.
median_of_lines() {
  sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# A run's steady tokens/s: the median of the logged tokens/s windows of its
# metrics.jsonl (argument), the first (warm-up) window left out.
steady_tokens_per_s() {
  grep '"tokens_per_s"' "$1" | tail -n +2 | sed 's/.*"tokens_per_s":\([0-9.e+]*\).*/\1/' | median_of_lines
}
