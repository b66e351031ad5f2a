#!/bin/sh
# Has systemd-networkd configure again an en* link it marked failed during the first five
# minutes of a boot, until one is configured. networkd now and then fails the renamed NIC
# ("Failed to configure DHCPv4 client: Device or resource busy": the kernel's eth0 was
# renamed while a DHCP client ran on it), marks it failed and never tries again, which
# leaves the guest without an address. Each retry is logged. An image whose network is not
# networkd's has nothing to retry.
command -v networkctl >/dev/null 2>&1 || exit 0
systemctl is-enabled --quiet systemd-networkd.service 2>/dev/null ||
  systemctl is-active --quiet systemd-networkd.service 2>/dev/null || exit 0
i=0
while [ "$i" -lt 150 ]; do
  links=$(networkctl list --no-legend --no-pager 2>/dev/null)
  for l in $(printf '%s\n' "$links" | awk '$2 ~ /^en/ && $5 == "failed" { print $2 }'); do
    echo "link $l failed; asking networkd to configure it again"
    networkctl reconfigure "$l"
  done
  if printf '%s\n' "$links" | awk '$2 ~ /^en/ && $5 == "configured" { ok = 1 } END { exit !ok }'; then
    exit 0
  fi
  i=$((i + 1))
  sleep 2
done
echo "no en* link configured after 300 s" >&2
exit 1
