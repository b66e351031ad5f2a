#!/usr/bin/env bash
# Builds control-plane binaries from the Go module proxy into a cache directory keyed by
# version, and prints that directory. setup-envtest downloads prebuilt binaries, which this
# project's machines cannot reach.
#
#   hack/envtest-assets.sh                 # kube-apiserver and etcd (what envtest runs)
#   hack/envtest-assets.sh kubectl         # or any command of k8s.io/kubernetes/cmd, by name
#   KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh) go test ./...
#
# hack/cluster.sh asks for kube-controller-manager, kube-scheduler, kubelet and kube-proxy
# besides; measured with the cache warm from kube-apiserver, kubectl and etcd: 163 s, 21 s,
# 357 s (the kubelet, built with cgo, compiles nearly all of its packages itself) and 27 s.
#
# Every k8s.io/kubernetes command (kube-apiserver, kubectl, kube-controller-manager, kubelet,
# ...) builds through one wrapper module; once the Go build cache holds the first, the next
# costs a fraction of it. etcd is a module of its own. Both modules take the operator's
# versions of the modules they share with it, and everything builds with CGO_ENABLED=0 and
# -trimpath like the operator (hack/lib/gobuild.sh), so after make lint's go vet the Go
# build cache already holds about half of kube-apiserver's packages (578 s alone, 294 s
# after go vet). kubelet alone keeps cgo, as Kubernetes' own release builds it.
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

# shellcheck source=hack/lib/gobuild.sh
source "$(dirname "$0")/lib/gobuild.sh"

export GOWORK=off GOFLAGS="-buildvcs=false -mod=mod -trimpath"
host_cgo=$(CGO_ENABLED='' go env CGO_ENABLED)
gover=$(go env GOVERSION)
log() { printf '[envtest-assets %s] %s\n' "$(date +%T)" "$*" >&2; }

fresh() { # name stamp: is the cached binary built for exactly this stamp?
  [[ -x "$dest/$1" && -f "$dest/$1.stamp" && "$(cat "$dest/$1.stamp")" == "$2" ]]
}
cgo_of() { # name: kubelet is the one command Kubernetes releases with cgo
  if [[ $1 == kubelet ]]; then echo "$host_cgo"; else echo 0; fi
}
stamp_of() { # name
  case $1 in
  etcd) echo "etcd v$ETCD_VERSION $gover cgo=0 trimpath operator-versions" ;;
  *) echo "$1 v$KUBE_VERSION $gover cgo=$(cgo_of "$1") trimpath operator-versions" ;;
  esac
}

(($# > 0)) || set -- kube-apiserver etcd
# Without the lock when every binary asked for is built: make test builds the cluster's
# binaries in the background (hack/background.sh) holding it, and a tier asking only for
# kube-apiserver and etcd must not wait for that. A binary is moved into place whole and
# its stamp written after it, so a reader never takes a partial one for fresh.
all_fresh=true
for name in "$@"; do
  fresh "$name" "$(stamp_of "$name")" || { all_fresh=false; break; }
done
if $all_fresh; then
  echo "$dest"
  exit 0
fi

exec 9>"$dest/.lock"
flock 9
install() { # tmpfile name stamp
  chmod 0755 "$1" && mv -f "$1" "$dest/$2" && printf '%s\n' "$3" >"$dest/$2.stamp"
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# kube_module: the wrapper module in $work/kubernetes, made once per run.
# k8s.io/kubernetes points its staging modules at ./staging, so `go install ...@v` is
# refused; the wrapper pins each of them to the published v0.X.Y of the same release.
kube_module() {
  [[ -f $work/kubernetes/go.mod ]] && return
  local minor patch gomod
  IFS=. read -r _ minor patch <<<"$KUBE_VERSION"
  wrapper_module "$work/kubernetes" kubernetes
  gomod=$(go mod download -json "k8s.io/kubernetes@v$KUBE_VERSION" | sed -n 's/.*"GoMod": "\(.*\)".*/\1/p')
  sed -n "s#^[[:space:]]*\(k8s\.io/[A-Za-z0-9._-]*\) => \./staging/src/.*#replace \1 => \1 v0.$minor.$patch#p" \
    "$gomod" >>"$work/kubernetes/go.mod"
  log "resolving k8s.io/kubernetes v$KUBE_VERSION ($(grep -c '^replace' "$work/kubernetes/go.mod") staging modules at v0.$minor.$patch)"
}

# kube_cmd NAME: k8s.io/kubernetes/cmd/NAME at KUBE_VERSION, with the version stamped in
# as a release build would have it.
kube_cmd() {
  local name=$1 stamp
  stamp=$(stamp_of "$name")
  fresh "$name" "$stamp" && return
  local t0=$SECONDS minor ld pkg
  IFS=. read -r _ minor _ <<<"$KUBE_VERSION"
  kube_module
  (
    cd "$work/kubernetes"
    go get "k8s.io/kubernetes/cmd/$name@v$KUBE_VERSION" >"get-$name.log" 2>&1 || { cat "get-$name.log" >&2; exit 1; }
    ld="-s -w"
    for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
      ld+=" -X $pkg.gitVersion=v$KUBE_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor -X $pkg.gitTreeState=clean"
    done
    log "building $name v$KUBE_VERSION (cgo=$(cgo_of "$name"); the first command compiles most of what the others need)"
    CGO_ENABLED=$(cgo_of "$name") go build -ldflags "$ld" -o "$dest/.$name.tmp" "k8s.io/kubernetes/cmd/$name"
  )
  install "$dest/.$name.tmp" "$name" "$stamp"
  log "$name built in $((SECONDS - t0))s"
}

etcd() {
  local stamp
  stamp=$(stamp_of etcd)
  fresh etcd "$stamp" && return
  local t0=$SECONDS
  wrapper_module "$work/etcd" etcd
  cd "$work/etcd"
  log "resolving go.etcd.io/etcd/server/v3 v$ETCD_VERSION"
  go get "go.etcd.io/etcd/server/v3@v$ETCD_VERSION" >get.log 2>&1 || { cat get.log >&2; exit 1; }
  log "building etcd v$ETCD_VERSION"
  CGO_ENABLED=0 go build -ldflags "-s -w" -o "$dest/.etcd.tmp" go.etcd.io/etcd/server/v3
  install "$dest/.etcd.tmp" etcd "$stamp"
  log "etcd built in $((SECONDS - t0))s"
}

for name in "$@"; do
  case $name in
  etcd) etcd ;;
  *[!a-z0-9-]* | "" | -*) log "error: $name is not a command of k8s.io/kubernetes/cmd"; exit 2 ;;
  *) kube_cmd "$name" ;;
  esac
done
echo "$dest"
