#!/usr/bin/env bash
# Installs what the crawler clients' tests need, once: Debian's Scrapy (the version the
# middleware in clients/scrapy is written against, 2.8 on bookworm) and pytest; and, to build
# clients/scrapy's wheel offline and install it into a virtual environment that sees
# Debian's Scrapy (hack/scrapy-wheel-test.sh), setuptools, wheel, pip and venv. All are
# Debian packages for Debian's own python3 (/usr/bin/python3), whatever python3 comes first
# on PATH; the tests run that interpreter. Besides, for TestDemoExternal (the VM-less demo
# and the docs' curl examples): tinyproxy, curl and jq. For TestGateway
# (test/crawl/gateway_test.go): Debian's chromium, driven headless through chromedp. For
# TestHCloudProxyLeavesOverIPv6 (test/crawl/ipv6_test.go): the address 2001:db8:46::1 (a
# documentation prefix) on the loopback interface, the IPv6 address of the test's stand-in
# Hetzner server, so that traffic to it stays on this machine.
# Idempotent: installed packages and the address are left alone; tinyproxy's own service is
# kept from starting.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=crawl-deps
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

packages=(python3-scrapy python3-pytest python3-setuptools python3-wheel python3-pip python3-venv tinyproxy curl jq chromium)
need=$(missing_packages "${packages[@]}")
[[ -z $need || $(id -u) -eq 0 ]] || die "need root to install: ${need//$'\n'/ }"
ensure_packages "${packages[@]}"

# The stand-in server's IPv6 address, on loopback only (nodad: usable at once).
if ! ip -6 addr show dev lo | grep -q 'inet6 2001:db8:46::1/128'; then
	[[ $(id -u) -eq 0 ]] || die "need root to add 2001:db8:46::1/128 to the loopback interface"
	ip -6 addr add 2001:db8:46::1/128 dev lo nodad
	log "added 2001:db8:46::1/128 to lo"
fi
