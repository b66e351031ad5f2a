#!/usr/bin/env bash
# Builds clients/scrapy's wheel (egress-proxies-scrapy) offline with Debian's python3,
# setuptools and wheel (hack/crawl-deps.sh installs them), from a copy of the sources so
# that the build leaves nothing in the tree.
#
#   hack/scrapy-wheel.sh build DIR   write the wheel into DIR and print its path
#   hack/scrapy-wheel.sh test        build it into a temporary directory, install it into a
#                                    fresh virtual environment made with
#                                    --system-site-packages (so Debian's Scrapy is the one
#                                    used), and run clients/scrapy/tests with that
#                                    environment's python against the installed package,
#                                    never the sources (tests/conftest.py checks where
#                                    egress_proxies was imported from)
#
# The wheel's version is egress_proxies.__version__, which must be the project's VERSION.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=scrapy-wheel
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

ROOT=$(cd "$HACK/.." && pwd)
SRC=$ROOT/clients/scrapy
PY=/usr/bin/python3
VERSION=$(<"$ROOT/VERSION")
export PYTHONDONTWRITEBYTECODE=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1

# build OUT: the wheel into OUT; prints its path.
build() {
  local out=$1 tmp
  tmp=$(mktemp -d)
  mkdir -p "$tmp/src" "$out"
  cp -r "$SRC/pyproject.toml" "$SRC/README.md" "$SRC/egress_proxies" "$tmp/src/"
  rm -rf "$tmp/src/egress_proxies/__pycache__"
  "$PY" -m pip wheel -q --no-deps --no-build-isolation --no-index -w "$tmp/dist" "$tmp/src" >&2 ||
    { rm -rf "$tmp"; die "building the wheel of $SRC failed (hack/crawl-deps.sh installs python3-setuptools, python3-wheel and python3-pip)"; }
  local whl=$tmp/dist/egress_proxies_scrapy-$VERSION-py3-none-any.whl
  if [[ ! -f $whl ]]; then
    local got
    got=$(cd "$tmp/dist" && echo *.whl)
    rm -rf "$tmp"
    die "built $got, want egress_proxies_scrapy-$VERSION-py3-none-any.whl: egress_proxies.__version__ in $SRC/egress_proxies/__init__.py is not VERSION ($VERSION)"
  fi
  mv -f "$whl" "$out/"
  rm -rf "$tmp"
  echo "$out/${whl##*/}"
}

case ${1:-} in
build)
  [[ -n ${2:-} ]] || die "usage: $0 build DIR"
  build "$2"
  ;;
test)
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  whl=$(build "$work/dist")
  log "built ${whl##*/}"
  "$PY" -m venv --system-site-packages "$work/venv" ||
    die "python3 -m venv failed (hack/crawl-deps.sh installs python3-venv)"
  # --no-index: Scrapy and tldextract must come from Debian's packages, in the ranges the
  # wheel declares; pip fails here when they do not.
  "$work/venv/bin/python" -m pip install -q --no-index "$whl" >&2
  log "installed into a virtual environment at $work/venv"
  # From an empty directory: neither the working directory nor the tests' own directory
  # holds egress_proxies, so the import can only find the installed one.
  mkdir "$work/run"
  cd "$work/run"
  EGRESS_PROXIES_TEST_INSTALLED=1 "$work/venv/bin/python" -m pytest -q -p no:cacheprovider "$SRC/tests"
  log "tests passed against the installed wheel"
  ;;
*)
  die "usage: $0 build DIR | test"
  ;;
esac
