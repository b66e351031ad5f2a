#!/usr/bin/env bash
# Many boots of the test guest, none stuck: boots it once with the user-data the operator
# renders (hack/guest-smoke.sh), then resets it BOOTS-1 times, waiting each time until a
# request through the guest's proxy reaches the host. For every boot it counts, from the
# guest's journal, networkd's "Device or resource busy" failures of the renamed NIC and the
# link-retry unit's retries (internal/proxyconfig/files/link-retry.sh), and it fails if
# any boot never served. The last line is the summary:
#
#   BOOTS <n> stuck <n> busy-boots <n> link-retries <n>
#
#   flock /tmp/epo-libvirt-host.lock hack/bench/guest-boots.sh
#
# Knobs: BOOTS (20), BENCH_RESULT_FILE (the per-boot lines and the summary are also
# written there), and guest-smoke.sh's SMOKE_DEADLINE and SMOKE_IMAGE. Each boot under
# TCG takes about a minute; a reset boots the same disk again, so cloud-init runs only
# its per-boot parts, while networkd meets the NIC's rename on every boot.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
LOG_TAG=guest-boots
# shellcheck source=../lib/common.sh
source "$ROOT/hack/lib/common.sh"

BOOTS=${BOOTS:-20}
((BOOTS >= 1)) || die "BOOTS=$BOOTS: want at least 1"
out=$(mktemp)
trap 'rm -f "$out"' EXIT
rc=0
SMOKE_NAME=epo-boots SMOKE_HTTP_PORT=18081 SMOKE_REBOOTS=$((BOOTS - 1)) "$ROOT/hack/guest-smoke.sh" | tee "$out" || rc=$?
grep -E '^(BOOT|BOOTS) ' "$out" >"${BENCH_RESULT_FILE:-/dev/null}" || true
grep -q '^BOOTS ' "$out" || die "guest-smoke.sh ended (exit $rc) before its summary"
exit "$rc"
