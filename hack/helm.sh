#!/usr/bin/env bash
# Builds the helm v3 command from the Go module proxy into the cache, keyed by version, and
# prints the binary's path. A module of its own, so the operator's go.mod never sees helm's
# dependencies; that module takes the operator's versions of the modules both use and builds
# with CGO_ENABLED=0 and -trimpath like the operator (hack/lib/gobuild.sh), so the packages
# make lint's go vet has compiled (k8s.io/client-go and the rest) are not compiled again.
#
#   HELM=$(hack/helm.sh); "$HELM" lint charts/egress-proxies-operator
#
# Knobs: HELM_VERSION (v3.22.0), CACHE (default ${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator).
# Idempotent: a binary whose stamp matches is skipped; concurrent runs serialise on a lock.
set -euo pipefail

HELM_VERSION=${HELM_VERSION:-v3.22.0}
cache=${CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator}
bin="$cache/bin/helm-$HELM_VERSION"
mkdir -p "$cache/bin"
# shellcheck source=hack/lib/gobuild.sh
source "$(dirname "$0")/lib/gobuild.sh"

export GOWORK=off GOFLAGS="-buildvcs=false -mod=mod -trimpath" CGO_ENABLED=0
stamp="helm $HELM_VERSION $(go env GOVERSION) trimpath operator-versions"

exec 9>"$bin.lock"
flock 9
if [[ -x $bin && -f $bin.stamp && "$(cat "$bin.stamp")" == "$stamp" ]]; then
  echo "$bin"
  exit 0
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
t0=$SECONDS
printf '[helm.sh %s] building helm %s\n' "$(date +%T)" "$HELM_VERSION" >&2
# The version is stamped in as a release build has it, so `helm version` tells the truth.
(
  wrapper_module "$work" helm
  cd "$work"
  go get "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" >get.log 2>&1 || { cat get.log >&2; exit 1; }
  go build -ldflags "-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION" -o helm helm.sh/helm/v3/cmd/helm
)
mv -f "$work/helm" "$bin"
printf '%s\n' "$stamp" >"$bin.stamp"
printf '[helm.sh %s] helm %s built in %ss\n' "$(date +%T)" "$HELM_VERSION" "$((SECONDS - t0))" >&2
echo "$bin"
