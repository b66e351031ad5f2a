#!/usr/bin/env bash
# Builds the guest disk the e2e tier boots: a small Debian bookworm image made offline from
# Debian's packages, and prints its path. The build is cached by a hash of this script, its
# helpers and its knobs, so a second run prints the same path at once.
#
#   hack/guest-image.sh                 # build if missing; prints .../guest-image/<hash>/guest.qcow2
#
# Beside it, guest-no-nft.qcow2 is the same disk without the nft binary: the e2e tier boots
# it to show that a guest whose egress fence cannot load never serves.
#
# What is in it: systemd, linux-image-amd64 (the -cloud kernel has no AHCI driver, so a SATA
# seed cdrom would go unseen), cloud-init reading only a NoCloud seed, qemu-guest-agent
# started as soon as its port appears, tinyproxy without a configuration of its own (it
# starts only once the seed's user-data has written the operator's), nftables (with the
# kernel modules the rendered egress fence loads), and wireguard-tools with the kernel's
# wireguard module. DHCP via systemd-networkd on the NIC's predictable name; no resolver.
#
# How it is made, with neither loop devices nor mounts: mmdebstrap (minbase) fills a
# directory; mkfs.ext4 -d turns it into the root filesystem; a FAT ESP filled with mtools
# carries systemd-boot as \EFI\BOOT\BOOTX64.EFI plus the kernel and initramfs; sfdisk writes
# a GPT and dd places both filesystems; qemu-img converts to compressed qcow2. UEFI only.
#
# Knobs: GUEST_IMAGE_CACHE (${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator/guest-image),
# DEBIAN_MIRROR, DEBIAN_SECURITY_MIRROR.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=guest-image
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
SUITE=bookworm
ESP_MIB=64
ROOT_SLACK_MIB=256
CMDLINE="root=LABEL=epo-root ro console=ttyS0,115200 quiet systemd.show_status=auto"
INCLUDE=systemd-sysv,udev,dbus,linux-image-amd64,initramfs-tools,zstd,cloud-init,cloud-guest-utils,qemu-guest-agent,tinyproxy,nftables,wireguard-tools,systemd-boot-efi,iproute2,netbase
TOOLS=(mmdebstrap dosfstools mtools fdisk e2fsprogs qemu-utils)

CACHE_ROOT=${GUEST_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator/guest-image}
key=$(cat "$HACK/guest-image.sh" "$HACK/lib/guest-image-customize.sh" "$HACK/lib/guest-seed-files.sh" \
  "$HACK/../internal/proxyconfig/files/link-retry.sh" "$HACK/../internal/proxyconfig/files/link-retry.service" |
  { cat; printf '%s\n' "$MIRROR" "$SECURITY_MIRROR" "$SUITE" "$INCLUDE"; } | sha256sum | cut -c1-16)
OUT_DIR=$CACHE_ROOT/$key
IMAGE=$OUT_DIR/guest.qcow2
NO_NFT_NAME=guest-no-nft
NO_NFT_IMAGE=$OUT_DIR/$NO_NFT_NAME.qcow2

cached() {
  [[ -s $IMAGE && -s $IMAGE.sha256 && -s $NO_NFT_IMAGE && -s $NO_NFT_IMAGE.sha256 ]]
}

if cached; then
  echo "$IMAGE"
  exit 0
fi
mkdir -p "$CACHE_ROOT/debs"
exec 9>"$CACHE_ROOT/.lock"
flock -w 1800 9 || die "another build holds $CACHE_ROOT/.lock"
if cached; then # built by whoever held the lock
  echo "$IMAGE"
  exit 0
fi
ensure_packages "${TOOLS[@]}"

WORK=$CACHE_ROOT/.build-$key
rm -rf "$WORK"
mkdir -p "$WORK"
# --one-file-system: should mmdebstrap ever leave /proc, /sys or /dev mounted in the tree,
# the clean-up must not walk into them.
trap 'rm -rf --one-file-system "$WORK"' EXIT
log "building $IMAGE"

build_rootfs() {
  # The .deb cache survives between builds (a changed script rebuilds without downloading).
  # In a mount namespace of its own, the /proc, /sys and /dev mmdebstrap mounts into the
  # tree vanish with it, even when the build is killed half way.
  unshare --mount --propagation private -- \
    mmdebstrap --mode=root --variant=minbase --include="$INCLUDE" \
    --aptopt='APT::Install-Recommends "false"' --aptopt='Acquire::Languages "none"' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/doc/*' \
    --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/locale/*' --dpkgopt='path-include=/usr/share/locale/locale.alias' \
    --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='force-unsafe-io' \
    --setup-hook="mkdir -p \"\$1/var/cache/apt/archives\"" \
    --setup-hook="sync-in '$CACHE_ROOT/debs' /var/cache/apt/archives/" \
    --customize-hook="sync-out /var/cache/apt/archives '$CACHE_ROOT/debs'" \
    --customize-hook="'$HACK/lib/guest-image-customize.sh' \"\$1\"" \
    --quiet "$SUITE" "$WORK/rootfs" \
    "deb $MIRROR $SUITE main" "deb $MIRROR $SUITE-updates main" "deb $SECURITY_MIRROR $SUITE-security main" \
    >"$WORK/mmdebstrap.log" 2>&1 || { tail -n 40 "$WORK/mmdebstrap.log" >&2; die "mmdebstrap failed"; }
  rm -f "$CACHE_ROOT"/debs/*.deb.partial 2>/dev/null || true
  local line
  grep -h '^kernel ' "$WORK/mmdebstrap.log" | while read -r line; do log "$line"; done
  log "root tree ready ($(du -sm "$WORK/rootfs" | cut -f1) MiB)"
}

build_esp() {
  local kver
  kver=$(find "$WORK/rootfs/usr/lib/modules" -mindepth 1 -maxdepth 1 -printf '%f\n' | sort -V | tail -n 1)
  mkfs.vfat -F 32 -n EPO-ESP -C "$WORK/esp.img" $((ESP_MIB * 1024)) >/dev/null
  export MTOOLS_SKIP_CHECK=1
  mmd -i "$WORK/esp.img" ::/EFI ::/EFI/BOOT ::/loader ::/loader/entries
  mcopy -i "$WORK/esp.img" "$WORK/rootfs/usr/lib/systemd/boot/efi/systemd-bootx64.efi" ::/EFI/BOOT/BOOTX64.EFI
  mcopy -i "$WORK/esp.img" "$WORK/rootfs/boot/vmlinuz-$kver" ::/vmlinuz
  mcopy -i "$WORK/esp.img" "$WORK/rootfs/boot/initrd.img-$kver" ::/initrd.img
  printf 'default debian.conf\ntimeout 0\nconsole-mode keep\n' >"$WORK/loader.conf"
  printf 'title Debian %s\nlinux /vmlinuz\ninitrd /initrd.img\noptions %s\n' "$kver" "$CMDLINE" >"$WORK/debian.conf"
  mcopy -i "$WORK/esp.img" "$WORK/loader.conf" ::/loader/loader.conf
  mcopy -i "$WORK/esp.img" "$WORK/debian.conf" ::/loader/entries/debian.conf
  log "ESP ready (kernel $kver, initramfs $(du -k "$WORK/rootfs/boot/initrd.img-$kver" | cut -f1) KiB)"
}

# build_disk NAME: the root tree and the ESP as the UEFI disk $OUT_DIR/NAME.qcow2, with its
# .sha256 beside it.
build_disk() {
  local name=$1 root_mib esp_sect root_sect
  root_mib=$(($(du -sm "$WORK/rootfs" | cut -f1) + ROOT_SLACK_MIB))
  rm -f "$WORK/root.img" "$WORK/disk.raw"
  mkfs.ext4 -q -L epo-root -d "$WORK/rootfs" "$WORK/root.img" "${root_mib}M" >&2
  esp_sect=$((ESP_MIB * 2048))
  root_sect=$((root_mib * 2048))
  # 1 MiB before the ESP and after the root for the primary and backup GPT
  truncate -s $(((2048 + esp_sect + root_sect + 2048) * 512)) "$WORK/disk.raw"
  sfdisk -q "$WORK/disk.raw" <<EOF
label: gpt
start=2048, size=$esp_sect, type=C12A7328-F81F-11D2-BA4B-00A0C93EC93B, name="esp"
start=$((2048 + esp_sect)), size=$root_sect, type=0FC63DAF-8483-4772-8E79-3D69D8477DE4, name="root"
EOF
  dd if="$WORK/esp.img" of="$WORK/disk.raw" bs=1M seek=1 conv=notrunc,sparse status=none
  dd if="$WORK/root.img" of="$WORK/disk.raw" bs=1M seek=$((1 + ESP_MIB)) conv=notrunc,sparse status=none
  mkdir -p "$OUT_DIR"
  qemu-img convert -f raw -O qcow2 -c "$WORK/disk.raw" "$WORK/$name.qcow2"
  (cd "$WORK" && sha256sum "$name.qcow2" >"$name.qcow2.sha256")
  mv -f "$WORK/$name.qcow2" "$OUT_DIR/$name.qcow2"
  mv -f "$WORK/$name.qcow2.sha256" "$OUT_DIR/$name.qcow2.sha256"
  log "disk ready: root ${root_mib} MiB, $name.qcow2 $(du -m "$OUT_DIR/$name.qcow2" | cut -f1) MiB"
}

build_rootfs
build_esp
build_disk guest
# The same disk without nft, for the e2e tier's fail-closed story: an image on which the
# egress fence cannot load (as on a stock image whose nftables install fails). Built last,
# so the variant is never the one that is missing: the cache test looks for both.
rm -f "$WORK/rootfs/usr/sbin/nft"
build_disk "$NO_NFT_NAME"
log "built $IMAGE and $NO_NFT_IMAGE"
echo "$IMAGE"
