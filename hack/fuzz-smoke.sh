#!/usr/bin/env bash
# Runs every fuzz target of the module for a short time, one target at a time.
#
#   hack/fuzz-smoke.sh                 every Fuzz function, FUZZTIME each (default 5s)
#   FUZZTIME=2m hack/fuzz-smoke.sh     longer runs on demand
#   hack/fuzz-smoke.sh ./internal/provider/...   only targets under these directories
#
# Targets are found by reading the *_test.go files, so nothing is compiled to find them.
# Files with a //go:build constraint are skipped: their targets are not part of the default
# build. A crasher found by a run is kept in the package's testdata/fuzz directory and the
# script exits non-zero after running the remaining targets.
set -euo pipefail

FUZZTIME="${FUZZTIME:-5s}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

dirs=()
for arg in "$@"; do
	dirs+=("${arg%/...}")
done
[[ ${#dirs[@]} -gt 0 ]] || dirs=(.)

# "<package dir> <target>" per line, sorted, without duplicates.
targets="$(
	find "${dirs[@]}" -name '*_test.go' -not -path '*/vendor/*' -not -path '*/testdata/*' -not -path './.git/*' -print0 |
		while IFS= read -r -d '' f; do
			if grep -q '^//go:build' "$f"; then
				continue
			fi
			sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*\*testing\.F).*/\1/p' "$f" |
				while read -r name; do
					printf '%s %s\n' "$(dirname "$f")" "$name"
				done
		done | sort -u
)"

if [[ -z "$targets" ]]; then
	echo "fuzz-smoke: no fuzz targets found"
	exit 0
fi

failed=()
count=0
while read -r dir name; do
	pkg="./${dir#./}"
	count=$((count + 1))
	echo "fuzz-smoke: $pkg $name for $FUZZTIME"
	# -run '^$' skips the unit tests; the anchored -fuzz matches exactly one target.
	if ! go test -run '^$' -fuzz "^${name}\$" -fuzztime "$FUZZTIME" "$pkg" </dev/null; then
		failed+=("$pkg $name")
	fi
done <<<"$targets"

if [[ ${#failed[@]} -gt 0 ]]; then
	echo "fuzz-smoke: ${#failed[@]} of $count targets failed:"
	printf '  %s\n' "${failed[@]}"
	exit 1
fi
echo "fuzz-smoke: $count targets passed"
