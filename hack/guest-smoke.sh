#!/usr/bin/env bash
# Boots the test guest on the local libvirt host the way the operator does and shows that it
# works: the guest agent reports the DHCP address, and a request through the guest's proxy
# reaches an HTTP server on the host's bridge address. Cleans up the domain, its volumes and
# its NVRAM afterwards (KEEP=1 leaves them for a look with virsh console).
#
#   hack/guest-smoke.sh            # host up + image built first (both cached)
#
# Knobs: SMOKE_NAME (epo-smoke), SMOKE_HTTP_PORT (18080), SMOKE_DEADLINE (seconds per wait,
# 900: TCG on a busy machine is slow), SMOKE_IMAGE (a qcow2 to boot instead of
# hack/guest-image.sh's), SMOKE_CLOSED=1 (a seed that leaves the proxy alone: it must
# refuse the bridge subnet), KEEP.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=guest-smoke
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

NAME=${SMOKE_NAME:-epo-smoke}
HTTP_PORT=${SMOKE_HTTP_PORT:-18080}
DEADLINE=${SMOKE_DEADLINE:-900}
CLOSED=${SMOKE_CLOSED:-0}
VIRSH=(virsh -q -c qemu:///system)

"$HACK/libvirt-host.sh" up
# shellcheck disable=SC1091
source "${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator/libvirt-host/env"
IMAGE=${SMOKE_IMAGE:-$("$HACK/guest-image.sh")}
log "image $IMAGE"

WORK=$(mktemp -d)
http_pid=""
cleanup() {
  [[ -n $http_pid ]] && kill "$http_pid" 2>/dev/null
  if [[ ${KEEP:-0} != 1 ]]; then
    "${VIRSH[@]}" destroy "$NAME" >/dev/null 2>&1 || true
    "${VIRSH[@]}" undefine --nvram "$NAME" >/dev/null 2>&1 || true
    local v
    for v in "$NAME.qcow2" "$NAME-seed.iso" "$NAME-base.qcow2"; do
      "${VIRSH[@]}" vol-delete --pool "$KVM2_TEST_POOL" "$v" >/dev/null 2>&1 || true
    done
  fi
  rm -rf "$WORK"
}
trap cleanup EXIT

upload() { # file volume: a raw volume of the file's size, filled over libvirt's stream
  local size
  size=$(stat -c %s "$1")
  "${VIRSH[@]}" vol-create-as "$KVM2_TEST_POOL" "$2" "$size" --format raw >/dev/null
  "${VIRSH[@]}" vol-upload --pool "$KVM2_TEST_POOL" "$2" "$1"
}

make_seed() {
  cat >"$WORK/meta-data" <<EOF
instance-id: $NAME
local-hostname: $NAME
EOF
  if [[ $CLOSED == 1 ]]; then
    printf '#cloud-config\n{}\n' >"$WORK/user-data"
  else
    open_user_data >"$WORK/user-data"
  fi
  : >"$WORK/vendor-data"
  genisoimage -quiet -output "$WORK/seed.iso" -volid cidata -joliet -rock \
    "$WORK/user-data" "$WORK/meta-data" "$WORK/vendor-data"
}

open_user_data() {
  cat <<EOF
#cloud-config
write_files:
  - path: /etc/tinyproxy/tinyproxy.conf
    content: |
      User tinyproxy
      Group tinyproxy
      Port 3128
      Timeout 600
      PidFile "/run/tinyproxy/tinyproxy.pid"
      Syslog On
      MaxClients 100
      Allow 127.0.0.1
      Allow $KVM2_TEST_BRIDGE_SUBNET
      DisableViaHeader Yes
runcmd:
  - [systemctl, restart, tinyproxy]
EOF
}

domain_xml() { # overlay-path seed-path
  local cpu="<cpu mode='host-passthrough'/>" mac
  [[ $KVM2_TEST_DOMAIN_TYPE == qemu ]] && cpu="<cpu mode='maximum'/>"
  mac=$(printf '52:54:00:%02x:%02x:%02x' $((RANDOM % 256)) $((RANDOM % 256)) $((RANDOM % 256)))
  cat <<EOF
<domain type='$KVM2_TEST_DOMAIN_TYPE'>
  <name>$NAME</name>
  <memory unit='MiB'>1024</memory>
  <vcpu>2</vcpu>
  <os firmware='efi'>
    <type arch='x86_64' machine='q35'>hvm</type>
    <firmware><feature enabled='no' name='secure-boot'/></firmware>
    <boot dev='hd'/>
  </os>
  <features><acpi/><apic/></features>
  $cpu
  <on_poweroff>destroy</on_poweroff>
  <devices>
    <disk type='file' device='disk'>
      <driver name='qemu' type='qcow2'/>
      <source file='$1'/>
      <target dev='vda' bus='virtio'/>
    </disk>
    <disk type='file' device='cdrom'>
      <driver name='qemu' type='raw'/>
      <source file='$2'/>
      <target dev='sda' bus='sata'/>
      <readonly/>
    </disk>
    <interface type='bridge'>
      <mac address='$mac'/>
      <source bridge='$KVM2_TEST_BRIDGE'/>
      <model type='virtio'/>
    </interface>
    <serial type='pty'><log file='/var/log/libvirt/qemu/$NAME-serial.log' append='off'/></serial>
    <console type='pty'/>
    <channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>
    <rng model='virtio'><backend model='random'>/dev/urandom</backend></rng>
    <video><model type='none'/></video>
    <memballoon model='none'/>
  </devices>
</domain>
EOF
}

agent_ip() {
  "${VIRSH[@]}" domifaddr --source agent "$NAME" 2>/dev/null |
    awk -v pfx="${KVM2_TEST_BRIDGE_IP%.*}." '$3 == "ipv4" && index($4, pfx) == 1 { split($4, a, "/"); print a[1]; exit }'
}

through_proxy() {
  curl -fsS --max-time 10 -x "http://$1:3128" "http://$KVM2_TEST_BRIDGE_IP:$HTTP_PORT/" | grep -q "$NAME-ok"
}

# tinyproxy itself answering 403: listening, and refusing a client it was not told to allow
proxy_refuses() {
  [[ $(curl -s -o /dev/null -w '%{http_code}' --max-time 10 -x "http://$1:3128" "http://$KVM2_TEST_BRIDGE_IP:$HTTP_PORT/") == 403 ]]
}

"${VIRSH[@]}" destroy "$NAME" >/dev/null 2>&1 || true # leftovers of an interrupted run
"${VIRSH[@]}" undefine --nvram "$NAME" >/dev/null 2>&1 || true
for v in "$NAME.qcow2" "$NAME-seed.iso" "$NAME-base.qcow2"; do
  "${VIRSH[@]}" vol-delete --pool "$KVM2_TEST_POOL" "$v" >/dev/null 2>&1 || true
done

upload "$IMAGE" "$NAME-base.qcow2"
"${VIRSH[@]}" pool-refresh "$KVM2_TEST_POOL" >/dev/null # libvirt now reads the volume as qcow2
"${VIRSH[@]}" vol-create-as "$KVM2_TEST_POOL" "$NAME.qcow2" 10G --format qcow2 \
  --backing-vol "$NAME-base.qcow2" --backing-vol-format qcow2 >/dev/null
make_seed
upload "$WORK/seed.iso" "$NAME-seed.iso"
log "volumes ready: base, overlay, seed"

mkdir -p "$WORK/www"
echo "$NAME-ok" >"$WORK/www/index.html"
python3 -m http.server --bind "$KVM2_TEST_BRIDGE_IP" --directory "$WORK/www" "$HTTP_PORT" >"$WORK/http.log" 2>&1 &
http_pid=$!

domain_xml "$("${VIRSH[@]}" vol-path --pool "$KVM2_TEST_POOL" "$NAME.qcow2")" \
  "$("${VIRSH[@]}" vol-path --pool "$KVM2_TEST_POOL" "$NAME-seed.iso")" >"$WORK/domain.xml"
"${VIRSH[@]}" define "$WORK/domain.xml" >/dev/null
t0=$SECONDS
"${VIRSH[@]}" start "$NAME" >/dev/null
log "started $NAME (type $KVM2_TEST_DOMAIN_TYPE); serial log /var/log/libvirt/qemu/$NAME-serial.log"

has_agent_ip() { [[ -n $(agent_ip) ]]; }
wait_until "$DEADLINE" "the guest agent to report an address on $KVM2_TEST_BRIDGE" has_agent_ip ||
  die "no address from the guest agent (see the serial log)"
ip=$(agent_ip)
t1=$SECONDS
log "agent reports $ip after $((t1 - t0))s"

if [[ $CLOSED == 1 ]]; then
  wait_until "$DEADLINE" "the proxy on $ip:3128 to answer 403" proxy_refuses "$ip" ||
    die "the proxy on $ip:3128 never refused (is it open, or not running?)"
  log "with no proxy configuration in the seed, $ip:3128 refuses the bridge subnet (403) after $((SECONDS - t0))s"
  exit 0
fi
wait_until "$DEADLINE" "a request through http://$ip:3128 to reach $KVM2_TEST_BRIDGE_IP:$HTTP_PORT" through_proxy "$ip" ||
  die "the proxy on $ip:3128 never answered"
t2=$SECONDS
log "proxy on $ip:3128 reaches $KVM2_TEST_BRIDGE_IP:$HTTP_PORT after $((t2 - t0))s"
echo "TIMING start->agent $((t1 - t0))s start->proxy $((t2 - t0))s"
