#!/usr/bin/env bash
# Installs what the crawler clients' tests need, once: Debian's Scrapy (the version the
# middleware in clients/scrapy is written against, 2.8 on bookworm) and pytest. Both are
# Debian packages for Debian's own python3 (/usr/bin/python3), whatever python3 comes first
# on PATH; the tests run that interpreter. Idempotent: installed packages are left alone.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=crawl-deps
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

need=$(missing_packages python3-scrapy python3-pytest)
[[ -z $need || $(id -u) -eq 0 ]] || die "need root to install: ${need//$'\n'/ }"
ensure_packages python3-scrapy python3-pytest
