#!/usr/bin/env bash
# Builds the control-plane binaries envtest runs (kube-apiserver and etcd) from the Go module
# proxy into a cache directory keyed by version, and prints that directory. setup-envtest
# downloads prebuilt binaries, which this project's machines cannot reach.
#
#   hack/envtest-assets.sh            # build if missing, print the assets dir
#   KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh) go test ./...
#
# Knobs: KUBE_VERSION (1.37.2, pairs with k8s.io/* v0.37.2 and controller-runtime v0.25),
# ETCD_VERSION (3.7.3), ENVTEST_CACHE (default ${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator/envtest).
# Idempotent: a binary whose stamp matches is skipped; concurrent runs serialise on a lock.
set -euo pipefail

KUBE_VERSION=${KUBE_VERSION:-1.37.2}
ETCD_VERSION=${ETCD_VERSION:-3.7.3}
cache_root=${ENVTEST_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator/envtest}
dest="$cache_root/$KUBE_VERSION"
mkdir -p "$dest"

export GOWORK=off GOFLAGS="-buildvcs=false -mod=mod"
export CGO_ENABLED=${CGO_ENABLED:-$(go env CGO_ENABLED)}
gover=$(go env GOVERSION)
log() { printf '[envtest-assets %s] %s\n' "$(date +%T)" "$*" >&2; }

exec 9>"$dest/.lock"
flock 9

fresh() { # name stamp: is the cached binary built for exactly this stamp?
  [[ -x "$dest/$1" && -f "$dest/$1.stamp" && "$(cat "$dest/$1.stamp")" == "$2" ]]
}
install() { # tmpfile name stamp
  chmod 0755 "$1" && mv -f "$1" "$dest/$2" && printf '%s\n' "$3" >"$dest/$2.stamp"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

apiserver() {
  local stamp="kube-apiserver v$KUBE_VERSION $gover cgo=$CGO_ENABLED"
  fresh kube-apiserver "$stamp" && return
  local t0=$SECONDS minor patch staging gomod ld pkg
  IFS=. read -r _ minor patch <<<"$KUBE_VERSION"
  staging="v0.$minor.$patch"
  mkdir -p "$work/apiserver" && cd "$work/apiserver"
  # k8s.io/kubernetes points its staging modules at ./staging, so `go install ...@v` is refused.
  # A wrapper module pins each of them to the published v0.X.Y of the same release.
  printf 'module local/kubeapiserver\n\ngo %s\n' "${gover#go}" >go.mod
  gomod=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  sed -n "s#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*#replace \1 => \1 $staging#p" "$gomod" >>go.mod
  log "resolving k8s.io/kubernetes v$KUBE_VERSION ($(grep -c '^replace' go.mod) staging modules at $staging)"
  go get "k8s.io/kubernetes/cmd/kube-apiserver@v$KUBE_VERSION" >get.log 2>&1 || { cat get.log >&2; exit 1; }
  ld="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ld+=" -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
  done
  log "building kube-apiserver v$KUBE_VERSION (about 15 min of CPU on a cold Go cache)"
  go build -ldflags "$ld" -o "$dest/.kube-apiserver.tmp" k8s.io/kubernetes/cmd/kube-apiserver
  install "$dest/.kube-apiserver.tmp" kube-apiserver "$stamp"
  log "kube-apiserver built in $((SECONDS - t0))s"
}

etcd() {
  local stamp="etcd v$ETCD_VERSION $gover cgo=$CGO_ENABLED"
  fresh etcd "$stamp" && return
  local t0=$SECONDS
  mkdir -p "$work/etcd" && cd "$work/etcd"
  printf 'module local/etcd\n\ngo %s\n' "${gover#go}" >go.mod
  log "resolving go.etcd.io/etcd/server/v3 v$ETCD_VERSION"
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >get.log 2>&1 || { cat get.log >&2; exit 1; }
  log "building etcd v$ETCD_VERSION"
  go build -ldflags "-s -w" -o "$dest/.etcd.tmp" go.etcd.io/etcd/server/v3
  install "$dest/.etcd.tmp" etcd "$stamp"
  log "etcd built in $((SECONDS - t0))s"
}

apiserver
etcd
echo "$dest"
