#!/usr/bin/env bash
# Runs every native Go fuzz target (func FuzzXxx in a _test.go file) for a fixed time each
# (default 20s): go test -fuzz runs one target of one package at a time. A failing input is
# written under the package's testdata/fuzz/<target>/ and fails the run.
set -euo pipefail
cd "$(dirname "$0")/.."
fuzztime="${1:-20s}"

targets="$(grep -rE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' . | grep -v '^./\.' |
  sed -E 's#^\./(.*)/[^/]*_test\.go:func (Fuzz[A-Za-z0-9_]*)\(.*#\1 \2#' | sort -u)"
if [ -z "$targets" ]; then
  echo "fuzz: no fuzz targets found" >&2
  exit 1
fi
n=0
while read -r dir name; do
  echo "==> fuzz: $name in ./$dir for $fuzztime" >&2
  # Minimizing a new input may take long; keep it within the target's time.
  go test -run '^$' -fuzz "^${name}\$" -fuzztime "$fuzztime" -fuzzminimizetime 5s "./$dir"
  n=$((n + 1))
done <<<"$targets"
echo "fuzz: $n targets, $fuzztime each, no failure" >&2
