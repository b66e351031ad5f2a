#!/usr/bin/env bash
# The manager's resident memory with 5,000 unrelated 4 KiB Secrets in the cluster
# (envtest), next to its memory on an empty cluster: cmd/manager/rss_bench_test.go,
# build tag rssbench. Takes a minute or two.
#
#   hack/bench/manager-rss.sh          # this tree
#   hack/bench/manager-rss.sh main     # the tree of a git ref (exported with git archive),
#                                      # with this tree's benchmark copied in
#
# Prints the test's log line; the figures also land in $RSS_RESULT_FILE when set.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
ref=${1:-}
dir=$ROOT
if [[ -n $ref ]]; then
  dir=$(mktemp -d /tmp/manager-rss-XXXXXX)
  trap 'rm -rf "$dir"' EXIT
  git -C "$ROOT" archive "$ref" | tar -x -C "$dir"
  cp "$ROOT/cmd/manager/rss_bench_test.go" "$dir/cmd/manager/"
fi
assets=$("$ROOT/hack/envtest-assets.sh")
cd "$dir"
echo "manager RSS benchmark on ${ref:-this tree} ($dir)" >&2
KUBEBUILDER_ASSETS=$assets EPO_REQUIRE_ENVTEST=1 go test -tags rssbench -count=1 -timeout 20m \
  -run '^TestManagerRSSWithUnrelatedSecrets$' -v ./cmd/manager/ 2>&1 | grep -E 'manager RSS|unrelated Secrets|^(--- |ok|FAIL)|rss_bench_test'
