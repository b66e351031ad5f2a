#!/usr/bin/env bash
# Installs the host tools the unit tests, `make lint` and the deploy tier need, once. Idempotent: a tool
# already on PATH is left alone. Today: isoinfo (Debian's genisoimage), an ISO reader
# independent of the code that writes the kvm2 seed; shellcheck, lint's gate over the
# shell scripts; promtool (Debian's prometheus package), which checks and tests the
# alerting rules, with the prometheus server the deploy tier starts; and curl, Python
# requests and tinyproxy, the real clients and exits of internal/gateway's tests.
set -euo pipefail

missing=()
command -v isoinfo >/dev/null 2>&1 || missing+=(genisoimage)
command -v shellcheck >/dev/null 2>&1 || missing+=(shellcheck)
# The same package holds the prometheus server the deploy tier runs as a process.
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || missing+=(prometheus)
# Real clients and exits for internal/gateway's tests: curl, Python requests, tinyproxy.
command -v curl >/dev/null 2>&1 || missing+=(curl)
command -v tinyproxy >/dev/null 2>&1 || missing+=(tinyproxy)
python3 -c 'import requests' >/dev/null 2>&1 || missing+=(python3-requests)

[ ${#missing[@]} -eq 0 ] && exit 0

if ! command -v apt-get >/dev/null 2>&1; then
  echo "hack/deps.sh: need ${missing[*]} and there is no apt-get; install them by hand" >&2
  exit 1
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || { echo "hack/deps.sh: need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
  sudo=(sudo)
fi
echo "hack/deps.sh: installing ${missing[*]}" >&2
export DEBIAN_FRONTEND=noninteractive
# Wait for another apt (unattended-upgrades, or a second tier installing at the same
# time) to let go of the dpkg lock instead of failing at once.
apt=("${sudo[@]}" apt-get -o DPkg::Lock::Timeout=600)
"${apt[@]}" install -y -q --no-install-recommends "${missing[@]}" >&2 ||
  { "${apt[@]}" update -q >&2 && "${apt[@]}" install -y -q --no-install-recommends "${missing[@]}" >&2; }
# The package is wanted for promtool (and, in the deploy tier, a prometheus process of the
# tier's own): the system service it enables would scrape nothing and hold port 9090.
if [[ " ${missing[*]} " == *" prometheus "* ]] && command -v systemctl >/dev/null 2>&1; then
  "${sudo[@]}" systemctl disable --now prometheus >/dev/null 2>&1 || true
fi
# Likewise tinyproxy: the tests run their own; the service would hold port 8888.
if [[ " ${missing[*]} " == *" tinyproxy "* ]] && command -v systemctl >/dev/null 2>&1; then
  "${sudo[@]}" systemctl disable --now tinyproxy >/dev/null 2>&1 || true
fi
