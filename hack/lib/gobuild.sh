# shellcheck shell=bash
# Building another project's Go command (kube-apiserver and the other Kubernetes binaries,
# etcd, helm) so that it shares the Go build cache with the operator's own builds (sourced,
# never run).
#
#   wrapper_module DIR NAME
#       a new module local/NAME at DIR (made if missing), for this Go, that requires what
#       require_operator_versions does
#   require_operator_versions DIR
#       in the module at DIR, require each module the operator's go.mod requires, at the
#       operator's version (minimal version selection may still raise one the command needs)
#
# A package compiles once for every build that asks for it with the same source, the same
# dependencies and the same flags. The Makefile builds with CGO_ENABLED=0 and -trimpath
# (GO_BUILD_ENV); a command built the same way against the operator's versions of the
# modules both use (k8s.io/api, apimachinery, client-go, apiserver, grpc, protobuf, otel,
# golang.org/x/...) finds those packages already compiled by make lint's go vet. Measured
# on a cold cache: kube-apiserver alone 578 s, after go vet 294 s.

# OPERATOR_GO_MOD: the go.mod to follow (the operator's own unless a test says otherwise).
: "${OPERATOR_GO_MOD:=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/go.mod}"

# operator_requires: each module of the operator's go.mod require lines, as path@version.
operator_requires() {
  awk '
    /^require[ \t]*\(/ { block = 1; next }
    block && /^\)/ { block = 0; next }
    block && NF >= 2 && $1 !~ /^\/\// { print $1 "@" $2 }
    /^require[ \t]+[^( \t]/ { print $2 "@" $3 }
  ' "$OPERATOR_GO_MOD"
}

require_operator_versions() {
  local dir=$1 args=() req
  while read -r req; do args+=("-require=$req"); done < <(operator_requires)
  ((${#args[@]} > 0)) || { echo "require_operator_versions: no require lines in $OPERATOR_GO_MOD" >&2; return 1; }
  (cd "$dir" && go mod edit "${args[@]}")
}

wrapper_module() {
  local dir=$1 name=$2
  mkdir -p "$dir"
  printf 'module local/%s\n\ngo %s\n' "$name" "$(go env GOVERSION | sed 's/^go//')" >"$dir/go.mod"
  require_operator_versions "$dir"
}
