#!/usr/bin/env bash
# Checks the references between the documentation and the code:
#   1. every citation of a section of ALGORITHMS.md in the tree (*.c, *.h, *.cu,
#      *.cuh, *.md, *.sh, *.py, meson.build), written "ALGORITHMS.md" and a
#      section sign with a number, "N" or "N.M", or a range "N.M–N.K", has a
#      heading in docs/ALGORITHMS.md that starts with that number: "## §N Title"
#      or "### §N.M Title". A range needs every section in it. A citation may
#      continue on the next line (the section sign after a comment's "*").
#   2. every relative link [text](path) in README.md and docs/*.md, outside
#      code blocks, points to a file or folder that exists.
# Prints FILE:LINE and what is missing for each problem and exits 1; exits 0
# when all is well. Usage: scripts/check-doc-refs.sh [SOURCE_ROOT]
# (default: the folder above this script). meson test runs it (tests/meson.build).
set -euo pipefail
export LC_ALL=C # byte-wise matching: "§" and "–" are literal UTF-8 bytes

root=${1:-"$(dirname "$0")/.."}
cd "$root"
doc=docs/ALGORITHMS.md
if [[ ! -f $doc ]]; then
  echo "check-doc-refs: $root/$doc is missing" >&2
  exit 1
fi

# Section numbers, optionally a range, right after "ALGORITHMS.md" (a link's ")" allowed).
number='[0-9]+(\.[0-9]+)?'
range="§$number((–|-)(§)?$number)?"
cite="ALGORITHMS\.md\)?[[:space:]]*$range"
search=(--include='*.c' --include='*.h' --include='*.cu' --include='*.cuh' --include='*.md'
        --include='*.sh' --include='*.py' --include=meson.build
        --exclude-dir='.[!.]*' --exclude-dir='build*' --exclude-dir=runs --exclude-dir=subprojects)

# "FILE:LINE:CITATION", one per citation: on one line, and across a line break.
citations() {
  grep -rnoE "${search[@]}" "$cite" . || true
  { grep -rnE "${search[@]}" 'ALGORITHMS\.md\)?[[:space:]]*$' . || true; } | while IFS=: read -r file line _; do
    next=$(sed -n "$((line + 1))p" "$file")
    if [[ $next =~ ^[[:space:]/*#-]*($range) ]]; then
      echo "$file:$line:ALGORITHMS.md ${BASH_REMATCH[1]}"
    fi
  done
}

# The section numbers that have a heading.
sections=$(sed -nE 's/^#+ §([0-9]+(\.[0-9]+)?)( .*)?$/\1/p' "$doc")

status=0
missing_sections=$(citations | awk -v sections="$sections" '
  BEGIN { n = split(sections, list, "\n"); for (i = 1; i <= n; i++) have[list[i]] = 1 }
  function need(where, section) {
    if (!(section in have)) printf "%s: ALGORITHMS.md §%s: no heading \"§%s\" in docs/ALGORITHMS.md\n",
                                   where, section, section
  }
  {
    # FILE:LINE:CITATION; the citation holds no ":".
    citation = $0; sub(/^.*:/, "", citation)
    where = substr($0, 1, length($0) - length(citation) - 1); sub(/^\.\//, "", where)
    sub(/^ALGORITHMS\.md\)?[ \t]*/, "", citation); text = citation
    gsub(/§/, "", text); gsub(/–/, "-", text)
    split(text, ends, "-")
    first = ends[1]; last = ends[2]
    need(where, first)
    if (last == "") next
    need(where, last)
    # every section between the two ends, when both are of one major section
    split(first, a, "."); split(last, b, ".")
    if (a[1] == b[1] && a[2] != "" && b[2] != "")
      for (k = a[2] + 1; k < b[2] + 0; k++) need(where, a[1] "." k)
  }')
if [[ -n $missing_sections ]]; then
  echo "$missing_sections"
  status=1
fi

# Relative markdown links in README.md and docs/*.md, outside fenced code blocks.
links=$(awk '
  FNR == 1 { fenced = 0 }
  /^[[:space:]]*```/ { fenced = !fenced; next }
  fenced { next }
  {
    line = $0
    while (match(line, /\]\([^)[:space:]]+( "[^"]*")?\)/)) {
      target = substr(line, RSTART + 2, RLENGTH - 3)
      line = substr(line, RSTART + RLENGTH)
      sub(/ ".*$/, "", target)
      if (target ~ /^(https?|mailto|ftp):/ || target ~ /^#/) continue
      sub(/#.*$/, "", target)
      print FILENAME ":" FNR ":" target
    }
  }' README.md docs/*.md)
while IFS=: read -r file line target; do
  [[ -z $file ]] && continue
  dir=$(dirname "$file")
  if [[ $target == /* ]]; then path=$target; else path=$dir/$target; fi
  if [[ ! -e $path ]]; then
    echo "$file:$line: link to $target: no such file ($path)"
    status=1
  fi
done <<<"$links"

exit $status
