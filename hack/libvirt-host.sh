#!/usr/bin/env bash
# A local libvirt host for the integration and e2e tiers, on a machine without systemd:
# libvirtd reached through sshd on loopback exactly as the operator reaches a real hypervisor
# (SSH, then the forwarded libvirt unix socket), a dir pool named default, and a bridge with
# DHCP whose guests can reach the host's bridge address and nothing else.
#
#   hack/libvirt-host.sh up        install what is missing, start what is not running (idempotent)
#   hack/libvirt-host.sh down      stop what up started, remove the bridge, rules and pool it made
#   hack/libvirt-host.sh purge     down, then delete the test user and the state directory
#   hack/libvirt-host.sh status    one line per part; exit 0 when everything is up
#   hack/libvirt-host.sh env       print the env file (source it, or eval this)
#   hack/libvirt-host.sh check-guard  a stand-in guest on the bridge reaches the host's bridge
#                                  address and no other address of the host
#   hack/libvirt-host.sh stop-sshd|start-sshd|stop-libvirtd|start-libvirtd
#                                  fault injection for tests; stop-sshd also drops open sessions
#
# State: ${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator/libvirt-host (pid files, configs,
# keys, logs, the env file). The pool lives in /var/lib/egress-proxies-operator/pool instead:
# QEMU runs as libvirt-qemu and cannot traverse root's home.
#
# Knobs: LIBVIRT_HOST_SSH_PORT (2222), LIBVIRT_HOST_USER (epotest), LIBVIRT_HOST_BRIDGE
# (epo-br0), LIBVIRT_HOST_BRIDGE_CIDR (10.123.0.1/24, a /24), LIBVIRT_HOST_POOL_DIR,
# LIBVIRT_HOST_DOMAIN_TYPE (kvm or qemu; detected when unset).
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=libvirt-host
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator
STATE=$CACHE/libvirt-host
RUN=$STATE/run
ENV_FILE=$STATE/env
KEY=$STATE/keys/id_ed25519
KNOWN_HOSTS=$STATE/keys/known_hosts
POOL_DIR=${LIBVIRT_HOST_POOL_DIR:-/var/lib/egress-proxies-operator/pool}
SSH_PORT=${LIBVIRT_HOST_SSH_PORT:-2222}
TEST_USER=${LIBVIRT_HOST_USER:-epotest}
BRIDGE=${LIBVIRT_HOST_BRIDGE:-epo-br0}
BRIDGE_CIDR=${LIBVIRT_HOST_BRIDGE_CIDR:-10.123.0.1/24}
BRIDGE_IP=${BRIDGE_CIDR%/*}
SUBNET=${BRIDGE_IP%.*}.0/24
SOCKET=/run/libvirt/libvirt-sock
GUARD=EPO-BRIDGE-GUARD
HOSTOUT=EPO-BRIDGE-HOSTOUT
VIRSH=(virsh -q -c qemu:///system)

PACKAGES=(libvirt-daemon-system libvirt-daemon-system-sysv libvirt-clients qemu-system-x86
  qemu-utils ovmf openssh-server dnsmasq-base iptables genisoimage
  # guest-image.sh builds the test guest's disk with these
  mmdebstrap dosfstools mtools fdisk e2fsprogs
  # the e2e tier's WireGuard exits: userspace WireGuard (this kernel may lack the module)
  wireguard-go wireguard-tools)

source "$HACK/lib/libvirt-host-parts.sh"
source "$HACK/lib/libvirt-host-net.sh"

# Serialises concurrent ups and downs. Daemons are started without any descriptor of ours
# (without_fds), so that none of them holds this lock, or a lock of the caller's such as
# `flock /tmp/epo-libvirt-host.lock make ...`, after this script exits.
lock() {
  exec 8>"$STATE/.lock"
  flock -w 300 8 || die "another libvirt-host.sh holds $STATE/.lock"
}

cmd_up() {
  mkdir -p "$RUN" "$STATE/etc" "$STATE/log" "$STATE/keys" "$STATE/dnsmasq"
  lock
  # Checked even when everything runs (a dpkg query per package), so that a package added
  # to the list after the host came up is installed by the next up.
  ensure_packages "${PACKAGES[@]}"
  if healthy; then
    write_env
    log "already up (ssh $TEST_USER@127.0.0.1:$SSH_PORT, bridge $BRIDGE $BRIDGE_CIDR)"
    return 0
  fi
  ensure_user
  start_virtlogd
  start_libvirtd
  ensure_pool
  start_sshd
  ensure_bridge
  ensure_guard_rules
  start_dnsmasq
  self_check
  write_env
  log "up; source $ENV_FILE"
}

cmd_down() {
  [[ -d $RUN ]] || { log "nothing to stop ($RUN absent)"; return 0; }
  lock
  if pid_alive "$RUN/libvirtd.pid" libvirtd; then
    destroy_our_domains
    remove_pool
  elif [[ -f $RUN/created-pool ]]; then
    log "libvirtd is not running: pool default stays defined until the next down"
  fi
  stop_pidfile dnsmasq "$RUN/dnsmasq.pid"
  stop_sshd
  stop_pidfile libvirtd "$RUN/libvirtd.pid" 60
  stop_pidfile virtlogd "$RUN/virtlogd.pid"
  remove_guard_rules
  remove_bridge
  rm -f "$ENV_FILE"
  log "down"
}

cmd_purge() {
  cmd_down
  if [[ -f $RUN/created-user ]]; then
    userdel -r "$(<"$RUN/created-user")" 2>/dev/null || true
    log "deleted user $(<"$RUN/created-user")"
  fi
  rm -rf "$STATE"
  log "removed $STATE"
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
purge) cmd_purge ;;
status) status ;;
env) cat "$ENV_FILE" 2>/dev/null || die "no env file at $ENV_FILE; run: $0 up" ;;
check-guard) check_guard ;;
stop-sshd) stop_sshd ;;
start-sshd) start_sshd ;;
stop-libvirtd) stop_pidfile libvirtd "$RUN/libvirtd.pid" 60 ;;
start-libvirtd) start_virtlogd && start_libvirtd ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
  ;;
esac
