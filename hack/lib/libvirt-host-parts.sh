# shellcheck shell=bash disable=SC2153 # STATE, RUN, SOCKET... are set by hack/libvirt-host.sh
# The parts hack/libvirt-host.sh starts and stops, one function each (sourced by it; the
# variables come from there). Every daemon is recorded by pid file under $RUN and everything
# created at run time by a marker there, so that down undoes exactly what up did.

stop_pidfile() { # name pidfile [seconds before SIGKILL]
  local name=$1 file=$2 grace=${3:-20} pid
  if pid_alive "$file" "$name"; then
    pid=$(<"$file")
    kill "$pid"
    if ! wait_until "$grace" "$name (pid $pid) to exit" bash -c "! kill -0 $pid"; then
      kill -9 "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$file"
}

sshd_answers() {
  timeout 3 bash -c "exec 3<>/dev/tcp/127.0.0.1/$SSH_PORT && head -c 4 <&3" 2>/dev/null | grep -q '^SSH-'
}

libvirt_answers() {
  [[ -S $SOCKET ]] && timeout 60 "${VIRSH[@]}" uri >/dev/null 2>&1
}

# One line per part on stdout; returns non-zero when any part is missing.
status() {
  local ok=0 part
  for part in virtlogd libvirtd sshd dnsmasq; do
    if pid_alive "$RUN/$part.pid" "$part"; then
      echo "$part: running (pid $(<"$RUN/$part.pid"))"
    else
      echo "$part: stopped"
      ok=1
    fi
  done
  if pid_alive "$RUN/libvirtd.pid" libvirtd && libvirt_answers; then
    echo "libvirt: answering on $SOCKET"
    if [[ $("${VIRSH[@]}" pool-info default 2>/dev/null | awk '$1 == "State:" { print $2 }') == running ]]; then
      echo "pool default: running"
    else
      echo "pool default: missing or inactive"
      ok=1
    fi
  else
    echo "libvirt: not answering"
    ok=1
  fi
  if sshd_answers; then echo "sshd: answering on 127.0.0.1:$SSH_PORT"; else echo "sshd: not answering"; ok=1; fi
  if ip -br addr show dev "$BRIDGE" 2>/dev/null | grep -q "$BRIDGE_CIDR"; then
    echo "bridge $BRIDGE: $BRIDGE_CIDR"
  else
    echo "bridge $BRIDGE: missing"
    ok=1
  fi
  if iptables -C FORWARD -i "$BRIDGE" -j "$GUARD" 2>/dev/null; then
    echo "guard rules: in place"
  else
    echo "guard rules: missing"
    ok=1
  fi
  return $ok
}

healthy() {
  status >/dev/null 2>&1
}

ensure_user() {
  getent group libvirt >/dev/null || die "group libvirt missing (libvirt-daemon-system creates it)"
  if ! id "$TEST_USER" >/dev/null 2>&1; then
    useradd -m -s /bin/bash -G libvirt "$TEST_USER"
    echo "$TEST_USER" >"$RUN/created-user"
    log "created user $TEST_USER"
  fi
  usermod -a -G libvirt "$TEST_USER"
  # sshd with UsePAM no refuses a locked account ('!'); '*' has no password and is not locked.
  usermod -p '*' "$TEST_USER"
  [[ -f $KEY ]] || ssh-keygen -q -t ed25519 -N '' -C "$TEST_USER@libvirt-host" -f "$KEY"
  local home
  home=$(getent passwd "$TEST_USER" | cut -d: -f6)
  install -d -m 0700 -o "$TEST_USER" -g "$TEST_USER" "$home/.ssh"
  install -m 0600 -o "$TEST_USER" -g "$TEST_USER" "$KEY.pub" "$home/.ssh/authorized_keys"
}

start_virtlogd() {
  pid_alive "$RUN/virtlogd.pid" virtlogd && return 0
  without_fds virtlogd -d -p "$RUN/virtlogd.pid"
  wait_until 20 "virtlogd pid file" pid_alive "$RUN/virtlogd.pid" virtlogd || die "virtlogd did not start"
  log "virtlogd started (pid $(<"$RUN/virtlogd.pid"))"
}

start_libvirtd() {
  pid_alive "$RUN/libvirtd.pid" libvirtd && return 0
  cat >"$STATE/etc/libvirtd.conf" <<EOF
unix_sock_group = "libvirt"
unix_sock_ro_perms = "0777"
unix_sock_rw_perms = "0770"
auth_unix_ro = "none"
auth_unix_rw = "none"
log_outputs = "3:file:$STATE/log/libvirtd.log"
EOF
  # The packaged NAT network would bring up virbr0 with its own DHCP, DNS and NAT rules.
  if [[ -L /etc/libvirt/qemu/networks/autostart/default.xml ]]; then
    rm -f /etc/libvirt/qemu/networks/autostart/default.xml
    log "disabled autostart of the packaged network 'default'"
  fi
  mkdir -p /run/libvirt
  local t=$SECONDS
  if [[ $(domain_type) == qemu && -c /dev/kvm ]]; then
    # A /dev/kvm that cannot run a stock guest (a paravirtual KVM without VT-x) makes libvirt
    # flip-flop: its QEMU probe, run as root, finds KVM; its validity check, done for the
    # qemu user who may not open /dev/kvm, does not. It then discards the cached probe and
    # probes again on every lookup, and each define takes minutes. In a mount namespace of
    # their own, libvirtd and its QEMUs see a /dev/kvm the qemu user may open, so probe and
    # check agree. Guests still run under TCG (domain type qemu).
    [[ -c $STATE/etc/kvm ]] || mknod -m 0660 "$STATE/etc/kvm" c "$((0x$(stat -c %t /dev/kvm)))" "$((0x$(stat -c %T /dev/kvm)))"
    chgrp kvm "$STATE/etc/kvm" 2>/dev/null || chmod 0666 "$STATE/etc/kvm"
    # shellcheck disable=SC2016 # $1 and $@ are the inner sh's arguments
    without_fds unshare --mount --propagation slave -- sh -c 'mount --bind "$1" /dev/kvm && shift && exec "$@"' \
      sh "$STATE/etc/kvm" libvirtd -d -f "$STATE/etc/libvirtd.conf" -p "$RUN/libvirtd.pid"
  else
    without_fds libvirtd -d -f "$STATE/etc/libvirtd.conf" -p "$RUN/libvirtd.pid"
  fi
  wait_until 60 "libvirtd socket $SOCKET" test -S "$SOCKET" || die "libvirtd did not create $SOCKET (see $STATE/log/libvirtd.log)"
  # The first call waits for the QEMU capability probe (about 5 s, more under load).
  wait_until 180 "libvirtd to answer on $SOCKET" libvirt_answers || die "libvirtd does not answer (see $STATE/log/libvirtd.log)"
  log "libvirtd started (pid $(<"$RUN/libvirtd.pid"), answering after $((SECONDS - t))s)"
  # The first domain call waits for libvirt to probe QEMU's capabilities (seconds on a quiet
  # machine, minutes on a loaded one; cached on disk afterwards). Pay it here, not in a test.
  t=$SECONDS
  timeout 900 "${VIRSH[@]}" domcapabilities --virttype qemu --arch x86_64 >/dev/null ||
    die "libvirtd could not probe QEMU (see $STATE/log/libvirtd.log)"
  log "QEMU capabilities ready after $((SECONDS - t))s"
  if [[ $("${VIRSH[@]}" net-list --name 2>/dev/null) == *default* ]]; then
    "${VIRSH[@]}" net-destroy default >/dev/null
    log "stopped the packaged network 'default'"
  fi
}

ensure_pool() {
  if ! "${VIRSH[@]}" pool-info default >/dev/null 2>&1; then
    mkdir -p "$POOL_DIR"
    "${VIRSH[@]}" pool-define-as default dir --target "$POOL_DIR" >/dev/null
    "${VIRSH[@]}" pool-build default >/dev/null
    echo "$POOL_DIR" >"$RUN/created-pool"
    log "defined dir pool default at $POOL_DIR"
  fi
  if [[ $("${VIRSH[@]}" pool-info default | awk '$1 == "State:" { print $2 }') != running ]]; then
    "${VIRSH[@]}" pool-start default >/dev/null
  fi
  # autostart brings the pool back after stop-libvirtd/start-libvirtd
  "${VIRSH[@]}" pool-autostart default >/dev/null
}

pool_path() {
  "${VIRSH[@]}" pool-dumpxml default 2>/dev/null | sed -n 's:.*<path>\(.*\)</path>.*:\1:p' | head -1
}

remove_pool() {
  [[ -f $RUN/created-pool ]] || return 0
  local dir
  dir=$(<"$RUN/created-pool")
  "${VIRSH[@]}" pool-destroy default >/dev/null 2>&1 || true
  "${VIRSH[@]}" pool-undefine default >/dev/null 2>&1 || true
  rm -rf -- "$dir"
  rm -f "$RUN/created-pool"
  log "removed pool default and $dir"
}

# A guest on our bridge or disk in our pool was started through this libvirtd; stopping
# libvirtd would leave its QEMU running and holding a tap on the bridge.
destroy_our_domains() {
  local d
  for d in $("${VIRSH[@]}" list --name 2>/dev/null); do
    if "${VIRSH[@]}" dumpxml "$d" 2>/dev/null | grep -q -e "bridge='$BRIDGE'" -e "$POOL_DIR/"; then
      "${VIRSH[@]}" destroy "$d" >/dev/null 2>&1 && log "destroyed domain $d"
    fi
  done
}

start_sshd() {
  if pid_alive "$RUN/sshd.pid" sshd && sshd_answers; then return 0; fi
  [[ -f $STATE/etc/ssh_host_ed25519_key ]] || ssh-keygen -q -t ed25519 -N '' -f "$STATE/etc/ssh_host_ed25519_key"
  cat >"$STATE/etc/sshd_config" <<EOF
Port $SSH_PORT
ListenAddress 127.0.0.1
HostKey $STATE/etc/ssh_host_ed25519_key
PidFile $RUN/sshd.pid
AllowUsers $TEST_USER
PubkeyAuthentication yes
AuthorizedKeysFile .ssh/authorized_keys
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
PermitRootLogin no
# Forwarding the libvirt socket (direct-streamlocal) needs both: AllowTcpForwarding no
# refuses unix-socket forwarding too.
AllowStreamLocalForwarding yes
AllowTcpForwarding local
X11Forwarding no
MaxSessions 64
MaxStartups 64:30:128
LogLevel VERBOSE
EOF
  mkdir -p /run/sshd
  chmod 0755 /run/sshd
  /usr/sbin/sshd -t -f "$STATE/etc/sshd_config" || die "sshd rejects $STATE/etc/sshd_config"
  without_fds /usr/sbin/sshd -f "$STATE/etc/sshd_config" -E "$STATE/log/sshd.log"
  wait_until 20 "sshd on 127.0.0.1:$SSH_PORT" sshd_answers || die "sshd does not answer (see $STATE/log/sshd.log)"
  printf '[127.0.0.1]:%s %s\n' "$SSH_PORT" "$(cut -d' ' -f1-2 "$STATE/etc/ssh_host_ed25519_key.pub")" >"$KNOWN_HOSTS"
  log "sshd started (pid $(<"$RUN/sshd.pid"), 127.0.0.1:$SSH_PORT)"
}

# The listener and the per-connection processes it forked, so open sessions drop as they
# would when a hypervisor's sshd goes away.
stop_sshd() {
  local pid kids=()
  if pid_alive "$RUN/sshd.pid" sshd; then
    pid=$(<"$RUN/sshd.pid")
    mapfile -t kids < <(pgrep -P "$pid" || true)
    if ((${#kids[@]} > 0)); then
      kill "${kids[@]}" 2>/dev/null || true
    fi
  fi
  stop_pidfile sshd "$RUN/sshd.pid"
}

test_ssh() {
  ssh -F /dev/null -i "$KEY" -p "$SSH_PORT" -o BatchMode=yes -o IdentitiesOnly=yes \
    -o StrictHostKeyChecking=yes -o UserKnownHostsFile="$KNOWN_HOSTS" "$TEST_USER@127.0.0.1" "$@"
}

# The same path the operator takes: key auth as the test user, then libvirt's socket.
self_check() {
  local state
  state=$(test_ssh virsh -q -c qemu:///system pool-info default | awk '$1 == "State:" { print $2 }') ||
    die "ssh $TEST_USER@127.0.0.1:$SSH_PORT could not reach libvirt"
  [[ $state == running ]] || die "pool default is '$state' through ssh"
  log "checked: ssh $TEST_USER@127.0.0.1:$SSH_PORT reaches libvirt, pool default running"
}

# kvm only with hardware virtualisation: a /dev/kvm without VT-x or AMD-V (a paravirtual
# KVM inside a VM) cannot run a stock guest kernel.
domain_type() {
  if [[ -n ${LIBVIRT_HOST_DOMAIN_TYPE:-} ]]; then
    echo "$LIBVIRT_HOST_DOMAIN_TYPE"
  elif [[ -c /dev/kvm ]] && grep -qwE 'vmx|svm' /proc/cpuinfo; then
    echo kvm
  else
    echo qemu # TCG
  fi
}

write_env() {
  local tmp
  tmp=$(mktemp "$STATE/.env.XXXXXX")
  cat >"$tmp" <<EOF
# Written by hack/libvirt-host.sh up; source it before the integration or e2e tests.
export KVM2_TEST_ADDRESS=127.0.0.1:$SSH_PORT
export KVM2_TEST_USER=$TEST_USER
export KVM2_TEST_KEY=$KEY
export KVM2_TEST_KNOWN_HOSTS=$KNOWN_HOSTS
export KVM2_TEST_SOCKET=$SOCKET
export KVM2_TEST_POOL=default
export KVM2_TEST_POOL_PATH=$(pool_path)
export KVM2_TEST_BRIDGE=$BRIDGE
export KVM2_TEST_BRIDGE_IP=$BRIDGE_IP
export KVM2_TEST_BRIDGE_SUBNET=$SUBNET
export KVM2_TEST_DOMAIN_TYPE=$(domain_type)
export KVM2_TEST_DHCP_LEASES=$STATE/dnsmasq/leases
export KVM2_TEST_SSHD_PIDFILE=$RUN/sshd.pid
export KVM2_TEST_LIBVIRTD_PIDFILE=$RUN/libvirtd.pid
# fault injection: \$KVM2_TEST_HOST_SCRIPT stop-sshd|start-sshd|stop-libvirtd|start-libvirtd
export KVM2_TEST_HOST_SCRIPT=$HACK/libvirt-host.sh
EOF
  chmod 0644 "$tmp"
  mv -f "$tmp" "$ENV_FILE"
}
