#!/usr/bin/env bash
# Runs every fuzz target of the module for a fixed number of inputs, one target at a time.
#
#   hack/fuzz-smoke.sh                            every Fuzz function, its own input count
#   hack/fuzz-smoke.sh ./internal/provider/...    only targets under these directories
#   FUZZTIME=2000000x hack/fuzz-smoke.sh          longer runs on demand (any -fuzztime value)
#
# Budgets are counts, never durations: at the end of a duration -fuzztime, Go 1.26's fuzz
# coordinator can fail a target with a bare "context deadline exceeded" when the machine is
# loaded (golang/go#75804, fixed in Go 1.27). A count has no deadline; on a loaded machine it
# only takes longer. Each Fuzz function carries its count on the line right above it:
#
#   //fuzzsmoke:count 100000
#   func FuzzParseThing(f *testing.F) {
#
# sized to a few seconds on a quiet 2-core machine (measured rates in docs/testing.md). A
# target without that line fails the run, naming the file to add it to.
#
# Targets are found by reading the *_test.go files, so nothing is compiled to find them.
# Files with a //go:build constraint are skipped: their targets are not part of the default
# build. Every failure is fatal. A finding (the target failed on an input, a panic
# included) is written by Go to the package's testdata/fuzz/<target>/ and named here with
# the command that replays it; commit it and it runs as a plain test case with go test.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

dirs=()
for arg in "$@"; do
	dirs+=("${arg%/...}")
done
[[ ${#dirs[@]} -gt 0 ]] || dirs=(.)

# "<package dir> <target> <count or ->" per line, sorted, without duplicates.
targets="$(
	find "${dirs[@]}" -name '*_test.go' -not -path '*/vendor/*' -not -path '*/testdata/*' -not -path './.git/*' -print0 |
		while IFS= read -r -d '' f; do
			if grep -q '^//go:build' "$f"; then
				continue
			fi
			awk -v dir="$(dirname "$f")" '
				/^func Fuzz[A-Za-z0-9_]*\(.*\*testing\.F\)/ {
					name = $2; sub(/\(.*/, "", name)
					print dir, name, (count == "" ? "-" : count)
				}
				{ count = "" }
				/^\/\/fuzzsmoke:count [0-9]+$/ { count = $2 }
			' "$f"
		done | sort -u
)"

if [[ -z "$targets" ]]; then
	echo "fuzz-smoke: no fuzz targets found"
	exit 0
fi

unsized=()
while read -r dir name count; do
	[[ $count != - ]] || unsized+=("$name in ${dir#./}: add a line //fuzzsmoke:count N right above it")
done <<<"$targets"
if [[ ${#unsized[@]} -gt 0 ]]; then
	echo "fuzz-smoke: fuzz targets without an input count:"
	printf '  %s\n' "${unsized[@]}"
	exit 1
fi

# The reproducers under a target's testdata/fuzz directory, one path a line.
corpus() { # dir name
	[[ -d "$1/testdata/fuzz/$2" ]] || return 0
	find "$1/testdata/fuzz/$2" -type f | sort
}

log="$(mktemp)"
trap 'rm -f "$log"' EXIT

failed=()
n=0
while read -r dir name count; do
	pkg="./${dir#./}"
	budget="${FUZZTIME:-${count}x}"
	n=$((n + 1))
	before="$(corpus "$dir" "$name")"
	start=$SECONDS
	echo "fuzz-smoke: $pkg $name, $budget"
	# -run '^$' skips the unit tests; the anchored -fuzz matches exactly one target. The
	# minimization of a finding is bounded by a count too.
	if go test -run '^$' -fuzz "^${name}\$" -fuzztime "$budget" -fuzzminimizetime 10000x "$pkg" </dev/null 2>&1 | tee "$log"; then
		echo "fuzz-smoke: $name passed in $((SECONDS - start))s"
		continue
	fi
	found="$(comm -13 <(printf '%s\n' "$before") <(corpus "$dir" "$name") | sed -e '/^$/d' -e 's#^\./##')"
	if [[ -n "$found" ]]; then
		while read -r f; do
			failed+=("$name: finding, reproducer $f (replay: go test -run '^$name/$(basename "$f")\$' $pkg)")
		done <<<"$found"
	elif grep -q 'failure while testing seed corpus entry' "$log"; then
		entry="$(sed -n 's/.*failure while testing seed corpus entry: \([^ ]*\).*/\1/p' "$log" | head -n 1)"
		if [[ -f "${dir#./}/testdata/fuzz/$entry" ]]; then
			failed+=("$name: finding, committed reproducer ${dir#./}/testdata/fuzz/$entry still fails (replay: go test -run '^$entry\$' $pkg)")
		else
			failed+=("$name: seed corpus entry $entry (an f.Add) fails (replay: go test -run '^$entry\$' $pkg)")
		fi
	else
		failed+=("$name: go test failed without writing a reproducer (see its output above)")
	fi
done <<<"$targets"

if [[ ${#failed[@]} -gt 0 ]]; then
	echo "fuzz-smoke: ${#failed[@]} failure(s) in $n targets:"
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
echo "fuzz-smoke: $n targets passed"
