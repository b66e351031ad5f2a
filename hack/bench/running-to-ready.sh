#!/usr/bin/env bash
# Running -> Ready on a real guest, before and after tinyproxy's start moved to boot. Boots
# the test guest with hack/guest-smoke.sh alternately (ABAB..., so both share the
# machine's load alike) with the user-data of two renderings, and prints each boot's
# figures and the medians:
#
#   before  the renderer of OLD_REF (default: the parent of the commit that put tinyproxy
#           behind the egress fence): tinyproxy configured and restarted from runcmd, at
#           the end of cloud-init's final stage;
#   after   this tree's renderer: tinyproxy started once, behind the fence, by a path unit
#           the moment cloud-init has written its files (early in its network stage).
#
# Running -> Ready stands for: the guest agent reports the guest's address (what turns a
# kvm2 Proxy Running) -> the first request through the guest's proxy reaches a server on
# the host (what the health probe needs for Ready). Both are polled by guest-smoke.sh
# with deadlines, never slept for; the operator's own polls (about a second each) are not
# in it. Both renderings boot the same image (hack/guest-image.sh).
#
#   flock /tmp/epo-libvirt-host.lock hack/bench/running-to-ready.sh
#
# Knobs: ROUNDS (3: boots per rendering), OLD_REF, BENCH_RESULT_FILE (the table is also
# written there), and guest-smoke.sh's SMOKE_DEADLINE and SMOKE_IMAGE.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOG_TAG=running-to-ready
# shellcheck source=../lib/common.sh
source "$ROOT/hack/lib/common.sh"

ROUNDS=${ROUNDS:-3}
OLD_REF=${OLD_REF:-aacc4f715ace225edf583eb0f59ad6af3d982789}
((ROUNDS >= 1)) || die "ROUNDS=$ROUNDS: want at least 1"

WORK=$(mktemp -d /tmp/running-to-ready-XXXXXX)
trap 'rm -rf "$WORK"' EXIT
# The old tree, exported with git archive, with this tree's renderer command copied in.
OLD_TREE=$WORK/before
mkdir -p "$OLD_TREE"
git -C "$ROOT" archive "$OLD_REF" | tar -x -C "$OLD_TREE"
mkdir -p "$OLD_TREE/hack/guest-userdata"
cp "$ROOT/hack/guest-userdata/main.go" "$OLD_TREE/hack/guest-userdata/"
# Build both renderers once, before any boot, so no compile runs beside a guest.
for tree in "$OLD_TREE" "$ROOT"; do
  (cd "$tree" && go build -o /dev/null ./hack/guest-userdata) || die "building the renderer in $tree failed"
done
"$ROOT/hack/guest-image.sh" >/dev/null

results=$WORK/results
: >"$results"
boot() { # n label tree
  local n=$1 label=$2 tree=$3 load0 load1 line
  load0=$(cut -d' ' -f1 /proc/loadavg)
  log "boot $n: $label (load $load0)"
  if line=$(SMOKE_NAME=epo-bench SMOKE_RENDER_TREE=$tree "$ROOT/hack/guest-smoke.sh" 2>"$WORK/boot-$n.log" | grep '^TIMING '); then
    load1=$(cut -d' ' -f1 /proc/loadavg)
    # TIMING start->agent 45.2s agent->proxy 30.1s start->proxy 75.3s
    awk -v n="$n" -v l="$label" -v a="$load0" -v b="$load1" \
      '{ gsub(/s$/, "", $3); gsub(/s$/, "", $5); gsub(/s$/, "", $7); print n, l, a, b, $3, $5, $7 }' <<<"$line" >>"$results"
    log "boot $n: $label $line"
  else
    echo "$n $label $load0 - failed - -" >>"$results"
    log "boot $n: $label failed; the end of its log:"
    tail -n 15 "$WORK/boot-$n.log" >&2
  fi
}

# guest-smoke.sh brings the host up; its env says whether guests run under kvm or TCG.
"$ROOT/hack/libvirt-host.sh" up
# shellcheck disable=SC1091
source "${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator/libvirt-host/env"

n=0
for ((r = 1; r <= ROUNDS; r++)); do
  n=$((n + 1)); boot "$n" before "$OLD_TREE"
  n=$((n + 1)); boot "$n" after "$ROOT"
done

median() { # label column
  awk -v l="$1" -v c="$2" '$2 == l && $c != "-" { print $c }' "$results" | sort -n |
    awk '{ v[NR] = $1 } END { if (NR == 0) print "-"; else if (NR % 2) print v[(NR + 1) / 2]; else printf "%.1f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
{
  printf 'Running -> Ready on the test guest (hack/bench/running-to-ready.sh), %s, %s, %d cores\n' \
    "$(date -u +%Y-%m-%dT%H:%MZ)" "domain type ${KVM2_TEST_DOMAIN_TYPE:-unknown}" "$(nproc)"
  printf 'before: %s (%s); after: this tree (%s)\n' "$OLD_REF" "$(git -C "$ROOT" log -1 --format=%cs "$OLD_REF")" "$(git -C "$ROOT" describe --always --dirty)"
  printf '%-5s %-7s %-12s %-10s %-20s %-13s %s\n' boot render "load1 start" "load1 end" "start->agent (boot)" "agent->proxy" "start->proxy"
  while read -r b l a e s r p; do
    printf '%-5s %-7s %-12s %-10s %-20s %-13s %s\n' "$b" "$l" "$a" "$e" "$s" "$r" "$p"
  done <"$results"
  before=$(median before 6) after=$(median after 6)
  printf 'median agent->proxy (Running -> Ready): before %ss, after %ss' "$before" "$after"
  if [[ $before != - && $after != - ]]; then
    awk -v a="$after" -v b="$before" 'BEGIN { printf ", after/before %.2f", a / b }'
  fi
  printf '\nmedian start->agent (the boot itself): before %ss, after %ss\n' "$(median before 5)" "$(median after 5)"
  printf 'failed boots: %d\n' "$(awk '$5 == "-"' "$results" | wc -l)"
} | tee "${BENCH_RESULT_FILE:-/dev/null}"
