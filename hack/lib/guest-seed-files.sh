#!/bin/sh
# Installed into the test guest image by hack/lib/guest-image-customize.sh as
# /usr/local/libexec/egress-proxies-operator-seed-files, run by
# egress-proxies-operator-seed-files.service as soon as the NoCloud seed's device appears.
#
# The operator's rendered cloud-config carries, on one comment line, every file it installs
# (tinyproxy's configuration, the egress fence, the systemd units that start tinyproxy
# behind it, the marker last) as a base64 tar.gz (internal/proxyconfig/earlyfiles.go).
# This unpacks that line into / and starts the path unit that starts tinyproxy, so the
# proxy serves as soon as the guest has an address instead of after cloud-init's Python
# has started twice (tens of seconds under emulation). cloud-init later writes the same
# files again, which changes nothing. A seed without the line (not rendered by the
# operator) is left to cloud-init alone.
#
#   egress-proxies-operator-seed-files                          # at boot
#   egress-proxies-operator-seed-files --user-data F --root R   # unpack F's files under R only
set -eu
prefix='# egress-proxies-operator-files: '
path_unit=egress-proxies-operator-tinyproxy.path
user_data='' root=/ boot=1
while [ $# -gt 0 ]; do
  case $1 in
    --user-data) user_data=$2 boot= && shift 2 ;;
    --root) root=$2 && shift 2 ;;
    *) echo "seed files: unknown argument $1" >&2 && exit 2 ;;
  esac
done

if [ -n "$boot" ]; then
  dev=/dev/disk/by-label/cidata
  dir=$(mktemp -d /run/egress-proxies-operator-seed.XXXXXX)
  trap 'umount "$dir" 2>/dev/null; rmdir "$dir"' EXIT
  mount -t iso9660 -o ro "$dev" "$dir"
  user_data=$dir/user-data
fi
[ -r "$user_data" ] || { echo "seed files: no user-data at $user_data; cloud-init alone configures this guest"; exit 0; }

# The rendered part is the last one of a multipart user-data: take the last such line.
line=$(grep -a "^$prefix" "$user_data" | tail -n 1 | tr -d '\r') || true
if [ -z "$line" ]; then
  echo "seed files: the user-data carries no rendered files; cloud-init alone configures this guest"
  exit 0
fi
n=$(printf '%s' "${line#"$prefix"}" | base64 -d | tar -xzvf - -C "$root" --no-same-owner --same-permissions | wc -l)
echo "seed files: unpacked $n rendered files under $root"
if [ -n "$boot" ]; then
  # The image does not enable tinyproxy, so nothing has loaded its unit (nor the path or
  # retry unit) yet and systemd reads them, drop-in included, from disk at the start below:
  # no daemon-reload, which reruns every generator (seconds under emulation). Should one of
  # them have been loaded all the same, reload, or tinyproxy would start without its fence.
  for unit in tinyproxy.service "$path_unit" egress-proxies-operator-fence-retry.service; do
    if [ "$(systemctl show -P NeedDaemonReload "$unit")" = yes ]; then
      echo "seed files: $unit was loaded before its files were written; reloading systemd"
      systemctl daemon-reload
      break
    fi
  done
  systemctl start --no-block "$path_unit"
  echo "seed files: started $path_unit"
fi
