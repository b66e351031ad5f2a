# shellcheck shell=bash disable=SC2153 # BRIDGE, SUBNET, RUN... are set by hack/libvirt-host.sh
# The guests' network on the local libvirt host: the bridge, the iptables rules that fence
# it in, DHCP on it, and a check that the fence holds (sourced by hack/libvirt-host.sh; the
# variables come from there).

ensure_bridge() {
  if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
    ip link add "$BRIDGE" type bridge stp_state 0 forward_delay 0
    echo "$BRIDGE" >"$RUN/created-bridge"
    log "created bridge $BRIDGE"
  fi
  ip addr replace "$BRIDGE_CIDR" dev "$BRIDGE"
  ip link set "$BRIDGE" up
}

remove_bridge() {
  [[ -f $RUN/created-bridge ]] || return 0
  ip link del "$(<"$RUN/created-bridge")" 2>/dev/null && log "deleted bridge $(<"$RUN/created-bridge")"
  rm -f "$RUN/created-bridge"
}

chain() { # table-cmd name rule... : (re)create a chain holding exactly these rules
  local ipt=$1 name=$2
  shift 2
  $ipt -N "$name" 2>/dev/null || $ipt -F "$name"
  local rule
  for rule in "$@"; do
    # shellcheck disable=SC2086
    $ipt -A "$name" $rule
  done
}

hook() { # table-cmd builtin-chain match... : jump into our chain once, first
  local ipt=$1 builtin=$2
  shift 2
  $ipt -C "$builtin" "$@" 2>/dev/null || $ipt -I "$builtin" 1 "$@"
}

unhook() {
  local ipt=$1 builtin=$2
  shift 2
  while $ipt -D "$builtin" "$@" 2>/dev/null; do :; done
}

# Guests may talk to the host's bridge address (and its DHCP server) and to nothing else:
# nothing is forwarded to or from the bridge, and the host sends nothing from the bridge
# subnet out of any other interface. Frames between two ports of the bridge (a guest and a
# test's network namespace) stay on it: once br_netfilter is loaded (a kubelet loads it)
# they pass through FORWARD too, in and out of the bridge, and must not be dropped there.
ensure_guard_rules() {
  chain iptables "$GUARD" "-i $BRIDGE -o $BRIDGE -j ACCEPT" "-j DROP"
  chain iptables "$GUARD-IN" "-p udp --dport 67 -j RETURN" "-d $BRIDGE_IP -j RETURN" "-j DROP"
  chain iptables "$HOSTOUT" "-o $BRIDGE -j RETURN" "-o lo -j RETURN" "-j DROP"
  hook iptables FORWARD -i "$BRIDGE" -j "$GUARD"
  hook iptables FORWARD -o "$BRIDGE" -j "$GUARD"
  hook iptables INPUT -i "$BRIDGE" -j "$GUARD-IN"
  hook iptables OUTPUT -s "$SUBNET" -j "$HOSTOUT"
  if command -v ip6tables >/dev/null && ip6tables -L FORWARD -n >/dev/null 2>&1; then
    hook ip6tables FORWARD -i "$BRIDGE" -j DROP
    hook ip6tables FORWARD -o "$BRIDGE" -j DROP
  fi
  echo "$BRIDGE $SUBNET" >"$RUN/guard-rules"
}

remove_guard_rules() {
  [[ -f $RUN/guard-rules ]] || return 0
  local br subnet
  read -r br subnet <"$RUN/guard-rules"
  unhook iptables FORWARD -i "$br" -j "$GUARD"
  unhook iptables FORWARD -o "$br" -j "$GUARD"
  unhook iptables INPUT -i "$br" -j "$GUARD-IN"
  unhook iptables OUTPUT -s "$subnet" -j "$HOSTOUT"
  unhook ip6tables FORWARD -i "$br" -j DROP
  unhook ip6tables FORWARD -o "$br" -j DROP
  local c
  for c in "$GUARD" "$GUARD-IN" "$HOSTOUT"; do
    iptables -F "$c" 2>/dev/null && iptables -X "$c" 2>/dev/null
  done
  rm -f "$RUN/guard-rules"
  log "removed guard rules for $br"
}

# DHCP only: --port=0 turns DNS off, and the empty router and dns-server options keep
# guests from learning a gateway or resolver.
start_dnsmasq() {
  pid_alive "$RUN/dnsmasq.pid" dnsmasq && return 0
  local pfx=${BRIDGE_IP%.*}
  without_fds dnsmasq --conf-file=/dev/null --port=0 --no-resolv --no-hosts \
    --interface="$BRIDGE" --bind-interfaces --except-interface=lo \
    --dhcp-range="$pfx.100,$pfx.199,255.255.255.0,1h" --dhcp-authoritative \
    --dhcp-option=option:router --dhcp-option=option:dns-server \
    --dhcp-leasefile="$STATE/dnsmasq/leases" --pid-file="$RUN/dnsmasq.pid" \
    --log-facility="$STATE/log/dnsmasq.log" --log-dhcp
  wait_until 20 "dnsmasq pid file" pid_alive "$RUN/dnsmasq.pid" dnsmasq || die "dnsmasq did not start (see $STATE/log/dnsmasq.log)"
  log "dnsmasq started (pid $(<"$RUN/dnsmasq.pid"), DHCP $pfx.100-199 on $BRIDGE)"
}

# Plays a guest: a network namespace on the bridge with an address and a default route via
# the host. The host's bridge address must answer (a refused connection counts), every
# other address of the host must stay silent.
check_guard() {
  local ns=epo-guard-check host_ips ip ok=0
  ip netns del "$ns" 2>/dev/null || true
  ip link del epo-gc0 2>/dev/null || true
  ip netns add "$ns"
  ip link add epo-gc0 type veth peer name epo-gc1
  ip link set epo-gc1 netns "$ns"
  ip link set epo-gc0 master "$BRIDGE" up
  ip -n "$ns" addr add "${BRIDGE_IP%.*}.250/24" dev epo-gc1
  ip -n "$ns" link set epo-gc1 up
  ip -n "$ns" route add default via "$BRIDGE_IP"
  # exit 1 = refused (the host's stack answered), 124 = dropped
  probe() { ip netns exec "$ns" timeout 3 bash -c "exec 3<>/dev/tcp/$1/9" 2>/dev/null; }
  probe "$BRIDGE_IP" && true
  if (($? == 124)); then echo "FAIL: $BRIDGE_IP does not answer from the bridge"; ok=1; else echo "ok: $BRIDGE_IP answers"; fi
  host_ips=$(ip -4 -o addr show | awk -v br="$BRIDGE" '$2 != br && $2 != "lo" { split($4, a, "/"); print a[1] }')
  for ip in $host_ips; do
    probe "$ip" && true
    if (($? == 124)); then echo "ok: $ip unreachable"; else echo "FAIL: $ip reachable from the bridge"; ok=1; fi
  done
  ip link del epo-gc0 2>/dev/null || true
  ip netns del "$ns"
  return $ok
}
