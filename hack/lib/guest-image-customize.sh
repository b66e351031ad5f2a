#!/usr/bin/env bash
# Turns the Debian tree mmdebstrap built into the test guest's root filesystem. Run by
# hack/guest-image.sh as mmdebstrap's customize hook, on the host, with the tree as $1.
set -euo pipefail
root=$1
in_root() { chroot "$root" "$@"; }
put() { # path mode: stdin becomes $root/path
  mkdir -p "$(dirname "$root/$1")"
  cat >"$root/$1"
  chmod "$2" "$root/$1"
}

echo epo-guest | put /etc/hostname 0644
printf '127.0.0.1 localhost\n127.0.1.1 epo-guest\n' | put /etc/hosts 0644
# mmdebstrap copies the build machine's resolver in; a guest must not inherit it.
: | put /etc/resolv.conf 0644
echo 'LABEL=epo-root / ext4 defaults,noatime 0 1' | put /etc/fstab 0644

# DHCP on the NIC by systemd-networkd; cloud-init leaves the network alone. The match is
# the predictable name alone: the kernel names the NIC eth0 and udev renames it (enp1s0,
# the virtio NIC of the kvm2 domain and of hack/guest-smoke.sh), and a DHCP client started
# on eth0 is still running at the rename, which networkd then fails to apply ("Failed to
# configure DHCPv4 client: Device or resource busy"), leaving the guest without an
# address. Matching by MAC cannot work (libvirt gives every domain a MAC of its own), nor
# by driver (eth0 has the same driver before the rename).
put /etc/systemd/network/80-dhcp.network 0644 <<'EOF'
[Match]
Name=en*

[Network]
DHCP=ipv4
LinkLocalAddressing=no
IPv6AcceptRA=no
EOF
in_root systemctl enable systemd-networkd.service >/dev/null 2>&1
# The rename race above is narrowed by the match, not closed: now and then networkd still
# fails the renamed link ("Failed to configure DHCPv4 client: Device or resource busy"),
# marks it failed and never tries again. The link-retry unit watches the en* links for the
# first five minutes of a boot and has networkd configure a failed one again. Its files are
# the ones the rendered cloud-config installs on any image (internal/proxyconfig/files).
files="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)/internal/proxyconfig/files"
put /usr/local/libexec/egress-proxies-operator-link-retry 0755 <"$files/link-retry.sh"
put /etc/systemd/system/egress-proxies-operator-link-retry.service 0644 <"$files/link-retry.service"
in_root systemctl enable egress-proxies-operator-link-retry.service >/dev/null 2>&1
# networkd normally waits for network-pre.target, which cloud-init's first stage holds back
# for as long as Python takes to start (a minute and more under TCG). With cloud-init off
# the network that wait buys nothing, and DHCP (so the address the agent reports) comes
# that much sooner. A drop-in cannot remove an ordering, so the unit is copied without it.
sed '/^After=/s/ network-pre.target//' "$root/lib/systemd/system/systemd-networkd.service" |
  put /etc/systemd/system/systemd-networkd.service 0644
in_root systemctl mask systemd-networkd-wait-online.service apt-daily.timer \
  apt-daily-upgrade.timer e2scrub_all.timer e2scrub_reap.service fstrim.timer \
  getty@tty1.service proc-sys-fs-binfmt_misc.automount proc-sys-fs-binfmt_misc.mount \
  systemd-binfmt.service >/dev/null 2>&1

# cloud-init: the NoCloud seed only; its locale module fails without generated locales.
put /etc/cloud/cloud.cfg.d/90-epo-guest.cfg 0644 <<'EOF'
datasource_list: [ NoCloud, None ]
network: {config: disabled}
locale: false
EOF

# The agent is how the host learns the guest's address. Started by udev when its virtio
# port appears, it would still be ordered after sysinit.target and so after cloud-init's
# first stages; without default dependencies it comes up as soon as its port exists.
put /etc/systemd/system/qemu-guest-agent.service.d/10-early.conf 0644 <<'EOF'
[Unit]
DefaultDependencies=no
After=local-fs.target
Conflicts=shutdown.target
Before=shutdown.target
EOF

# No tinyproxy configuration: the only one is the operator's rendering
# (internal/proxyconfig), which the seed's user-data writes before tinyproxy starts.
# Without it tinyproxy exits at once ("Could not open config file") and nothing listens,
# so the image's proxy never answers with a configuration of its own. dpkg keeps a
# removed conffile removed.
rm -f "$root/etc/tinyproxy/tinyproxy.conf"

# tinyproxy from the seed, before cloud-init: the unit below runs as soon as the NoCloud
# seed's device appears and unpacks the files the operator's rendered cloud-config carries
# on one comment line (hack/lib/guest-seed-files.sh), then starts the path unit that starts
# tinyproxy behind the egress fence. cloud-init's two Python stages (tens of seconds under
# TCG) then no longer stand between the guest's address and its proxy answering; cloud-init
# still writes the same files afterwards. Stock images do without it: there cloud-init's
# network stage writes the files and starts the path unit.
put /usr/local/libexec/egress-proxies-operator-seed-files 0755 <"$(dirname "${BASH_SOURCE[0]}")/guest-seed-files.sh"
put /etc/systemd/system/egress-proxies-operator-seed-files.service 0644 <<'EOF'
[Unit]
Description=Install the operator's rendered proxy files from the NoCloud seed
DefaultDependencies=no
After=local-fs.target dev-disk-by\x2dlabel-cidata.device
Conflicts=shutdown.target
Before=shutdown.target
[Service]
Type=oneshot
ExecStart=/usr/local/libexec/egress-proxies-operator-seed-files
[Install]
WantedBy=dev-disk-by\x2dlabel-cidata.device
EOF
in_root systemctl enable egress-proxies-operator-seed-files.service >/dev/null 2>&1
# Not enabled: the seed unit (or, without it, cloud-init's bootcmd) starts tinyproxy through
# the rendered path unit, on every boot. Left unreferenced at boot, tinyproxy's unit is read
# from disk, with the rendered drop-in, when the path unit starts it, so the seed unit need
# not reload systemd first.
in_root systemctl disable tinyproxy.service >/dev/null 2>&1
# Debian's tinyproxy.service is ordered after network.target, which waits for
# network-pre.target and so for cloud-init's first stage (a Python start, tens of seconds
# under TCG): the rendered drop-in cannot remove an ordering, so the unit is copied
# without it, as networkd's is above. tinyproxy needs no network to listen; the fence
# script waits for the address.
sed -e '/^After=network\.target$/d' -e '/^After=/s/ *network\.target//' \
  "$root/lib/systemd/system/tinyproxy.service" | put /etc/systemd/system/tinyproxy.service 0644
if grep -q 'network\.target' "$root/etc/systemd/system/tinyproxy.service"; then
  echo "tinyproxy.service is still ordered after network.target" >&2
  exit 1
fi
[[ -L "$root/etc/systemd/system/dev-disk-by\x2dlabel-cidata.device.wants/egress-proxies-operator-seed-files.service" ]]

# No password anywhere; the serial console shows the boot, nobody logs in on it.
in_root passwd -l root >/dev/null

# Keep only the modules a q35 guest with virtio and SATA devices uses (with what they
# depend on): udev then has little to load under TCG, and the initramfs stays small. The
# nf_tables ones are what the rendered egress fence (internal/proxyconfig/fence.go) loads:
# its sets and meta, payload and tcp matches are in nf_tables itself, reject and fib not.
# wireguard (with its crypto and UDP tunnel modules) is for a WireGuard egress: the
# image's wireguard-tools configure it, and the kernel has it as a module only.
want="virtio_pci virtio_blk virtio_scsi virtio_net virtio_console virtio_rng ahci sd_mod
  sr_mod isofs vfat nls_utf8 nls_cp437 nls_ascii ext4 crc32c_generic efivarfs af_packet autofs4
  nf_tables nfnetlink nft_reject_inet nft_fib_inet wireguard"
for kdir in "$root"/usr/lib/modules/*; do
  kver=$(basename "$kdir")
  keep=$(mktemp)
  all=$(mktemp)
  for m in $want; do
    in_root modprobe -S "$kver" --show-depends "$m" 2>/dev/null | awk '$1 == "insmod" { print $2 }'
  done | sed 's#^/lib/#/usr/lib/#' | sort -u >"$keep"
  (cd "$root" && find "usr/lib/modules/$kver/kernel" -name '*.ko*' | sed 's#^#/#' | sort) >"$all"
  comm -23 "$all" "$keep" | sed "s#^#$root#" | xargs -r rm -f
  find "$kdir/kernel" -type d -empty -delete
  echo "kernel $kver: kept $(wc -l <"$keep") of $(wc -l <"$all") modules" >&2
  rm -f "$keep" "$all"
  in_root depmod "$kver"
  # Every wanted module (and what it depends on) must still load from the pruned tree.
  for m in $want; do
    in_root modprobe -S "$kver" --show-depends "$m" >/dev/null 2>&1 ||
      { echo "kernel $kver: module $m is missing after pruning" >&2; exit 1; }
  done
  echo "kernel $kver: wireguard $(in_root modinfo -k "$kver" -F version wireguard) at $(in_root modinfo -k "$kver" -F filename wireguard)" >&2
done
in_root wg --version >/dev/null

printf 'MODULES=list\nCOMPRESS=zstd\nRESUME=none\n' | put /etc/initramfs-tools/conf.d/90-epo-guest 0644
# sr_mod: the seed's cdrom is found in the initramfs already, so its device (which starts
# the seed unit) is there as soon as udev runs in the real root.
printf 'virtio_pci\nvirtio_blk\nvirtio_scsi\nahci\nsd_mod\nsr_mod\next4\n' >>"$root/etc/initramfs-tools/modules"
in_root update-initramfs -u -k all >/dev/null 2>&1

# A new machine id on first boot; no apt lists or caches in the image.
: | put /etc/machine-id 0444
rm -f "$root/var/lib/dbus/machine-id"
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/*.bin "$root"/var/log/*.log
