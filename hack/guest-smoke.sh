#!/usr/bin/env bash
# Boots the test guest on the local libvirt host the way the operator does, with the
# user-data the operator renders (hack/guest-userdata: tinyproxy on 3128 for the bridge
# subnet, behind the egress fence, the host's bridge address allowed through it), and
# shows that it works: the guest agent reports the DHCP address, and a request through the
# guest's proxy reaches an HTTP server on the host's bridge address. Cleans up the domain,
# its volumes and its NVRAM afterwards (KEEP=1 leaves them for a look with virsh console).
#
#   hack/guest-smoke.sh            # host up + image built first (both cached)
#
# Prints a last line `TIMING start->agent <s> agent->proxy <s> start->proxy <s>`.
#
# Knobs: SMOKE_NAME (epo-smoke), SMOKE_HTTP_PORT (18080), SMOKE_DEADLINE (seconds per wait,
# 900: TCG on a busy machine is slow), SMOKE_IMAGE (a qcow2 to boot instead of
# hack/guest-image.sh's), SMOKE_RENDER_TREE (the source tree whose renderer makes the
# user-data: another commit's, for comparisons; this one's by default), KEEP,
# SMOKE_REBOOTS (0: after the first boot works, reset the domain this many times, each
# boot waited for until its proxy answers, and count the boots whose network networkd
# failed with "Device or resource busy" and the link-retry unit's retries; the last
# line is then `BOOTS ...`, see hack/bench/guest-boots.sh), and one of:
#   SMOKE_CLOSED=1        a seed without the operator's configuration: once cloud-init has
#                         finished, nothing may answer on 3128 (the image has no tinyproxy
#                         configuration of its own) and tinyproxy must not be running;
#   SMOKE_LATE_ADDRESS=1  the guest's address comes late: the NIC's link starts down and
#                         comes up only once the fence has given up waiting for an
#                         address; the proxy must then come up by itself (the fence's
#                         retry), behind the fence.
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LOG_TAG=guest-smoke
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

NAME=${SMOKE_NAME:-epo-smoke}
HTTP_PORT=${SMOKE_HTTP_PORT:-18080}
DEADLINE=${SMOKE_DEADLINE:-900}
CLOSED=${SMOKE_CLOSED:-0}
LATE=${SMOKE_LATE_ADDRESS:-0}
RENDER_TREE=${SMOKE_RENDER_TREE:-$(cd "$HACK/.." && pwd)}
VIRSH=(virsh -q -c qemu:///system)
[[ $CLOSED == 1 && $LATE == 1 ]] && die "SMOKE_CLOSED and SMOKE_LATE_ADDRESS exclude each other"

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

now() { echo "${EPOCHREALTIME/,/.}"; }
since() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.1f", b - a }'; }

upload() { # file volume: a raw volume of the file's size, filled over libvirt's stream
  local size
  size=$(stat -c %s "$1")
  "${VIRSH[@]}" vol-create-as "$KVM2_TEST_POOL" "$2" "$size" --format raw >/dev/null
  "${VIRSH[@]}" vol-upload --pool "$KVM2_TEST_POOL" "$2" "$1"
}

# The user-data the operator renders, from the renderer of RENDER_TREE.
rendered_user_data() {
  python3 -c 'import json, sys; print(json.dumps({"config": {"Port": 3128,
    "AllowedSourceRanges": [sys.argv[1]], "AllowedDestinations": [sys.argv[2] + "/32"]}}))' \
    "$KVM2_TEST_BRIDGE_SUBNET" "$KVM2_TEST_BRIDGE_IP" |
    (cd "$RENDER_TREE" && go run ./hack/guest-userdata)
}

make_seed() {
  cat >"$WORK/meta-data" <<EOF
instance-id: $NAME
local-hostname: $NAME
EOF
  if [[ $CLOSED == 1 ]]; then
    printf '#cloud-config\n{}\n' >"$WORK/user-data"
  else
    rendered_user_data >"$WORK/user-data" || die "rendering the user-data in $RENDER_TREE failed"
  fi
  : >"$WORK/vendor-data"
  genisoimage -quiet -output "$WORK/seed.iso" -volid cidata -joliet -rock \
    "$WORK/user-data" "$WORK/meta-data" "$WORK/vendor-data"
}

domain_xml() { # overlay-path seed-path
  local cpu="<cpu mode='host-passthrough'/>" mac link=""
  [[ $LATE == 1 ]] && link="<link state='down'/>"
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
      $link
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

# nothing listening on the proxy port: curl's "could not connect" (7), not an HTTP answer
proxy_port_closed() {
  local rc=0
  curl -s -o /dev/null --max-time 10 "http://$1:3128/" || rc=$?
  ((rc == 7))
}

# guest_exec PATH ARG...: runs a command in the guest through the guest agent and prints
# its output (stdout, then stderr) once it has exited; fails when the agent does.
exec_pid="" exec_status=""
guest_exec_done() {
  exec_status=$("${VIRSH[@]}" qemu-agent-command "$NAME" "{\"execute\":\"guest-exec-status\",\"arguments\":{\"pid\":$exec_pid}}") &&
    python3 -c 'import json, sys; sys.exit(0 if json.load(sys.stdin)["return"]["exited"] else 1)' <<<"$exec_status"
}
guest_exec() {
  local req
  req=$(python3 -c 'import json, sys; print(json.dumps({"execute": "guest-exec",
    "arguments": {"path": sys.argv[1], "arg": sys.argv[2:], "capture-output": True}}))' "$@")
  exec_pid=$("${VIRSH[@]}" qemu-agent-command "$NAME" "$req" | python3 -c 'import json, sys; print(json.load(sys.stdin)["return"]["pid"])') ||
    return 1
  wait_until 60 "$1 to exit in the guest" guest_exec_done || return 1
  python3 -c 'import base64, json, sys; r = json.load(sys.stdin)["return"]
sys.stdout.write(base64.b64decode(r.get("out-data", "")).decode() + base64.b64decode(r.get("err-data", "")).decode())' <<<"$exec_status"
}

cloud_init_finished() {
  local out
  out=$(guest_exec /usr/bin/cloud-init status) && [[ $out == *"status: done"* || $out == *"status: error"* ]]
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
t0=$(now)
"${VIRSH[@]}" start "$NAME" >/dev/null
log "started $NAME (type $KVM2_TEST_DOMAIN_TYPE); serial log /var/log/libvirt/qemu/$NAME-serial.log"

# SMOKE_LATE_ADDRESS: the NIC's link starts down, so tinyproxy's first start (from the seed,
# before cloud-init) finds no address; once the fence script has given up waiting and left
# its marker (read through the guest agent, which needs no network), the link comes up.
fence_gave_up() {
  [[ $(guest_exec /bin/sh -c 'test -e /run/egress-proxies-operator/fence-no-address && echo gave-up') == gave-up* ]]
}
if [[ $LATE == 1 ]]; then
  wait_until "$DEADLINE" "the egress fence to give up waiting for an address (its marker, through the guest agent)" fence_gave_up ||
    die "the fence never gave up waiting for an address"
  "${VIRSH[@]}" domif-setlink "$NAME" "$(awk -F"'" '/<mac address=/ { print $2 }' "$WORK/domain.xml")" up >/dev/null
  log "the fence gave up waiting for an address after $(since "$t0" "$(now)")s; the NIC's link is up now"
fi

has_agent_ip() { [[ -n $(agent_ip) ]]; }
wait_until "$DEADLINE" "the guest agent to report an address on $KVM2_TEST_BRIDGE" has_agent_ip ||
  die "no address from the guest agent (see the serial log)"
ip=$(agent_ip)
t1=$(now)
log "agent reports $ip after $(since "$t0" "$t1")s"

if [[ $CLOSED == 1 ]]; then
  wait_until "$DEADLINE" "the guest's cloud-init to finish" cloud_init_finished ||
    die "the guest's cloud-init never finished"
  proxy_port_closed "$ip" || die "something answers on $ip:3128 with no configuration in the seed"
  active=$(guest_exec /usr/bin/systemctl is-active tinyproxy.service || true)
  [[ $active == active* || $active == activating* ]] && die "tinyproxy is $active without a configuration"
  log "with no proxy configuration in the seed, nothing listens on $ip:3128 and tinyproxy is $(echo "$active" | head -n 1) after $(since "$t0" "$(now)")s"
  exit 0
fi
wait_until "$DEADLINE" "a request through http://$ip:3128 to reach $KVM2_TEST_BRIDGE_IP:$HTTP_PORT" through_proxy "$ip" ||
  die "the proxy on $ip:3128 never answered"
t2=$(now)
log "proxy on $ip:3128 reaches $KVM2_TEST_BRIDGE_IP:$HTTP_PORT after $(since "$t0" "$t2")s"
if [[ $LATE == 1 ]]; then
  journal=$(guest_exec /usr/bin/journalctl -b -o cat --no-pager -u tinyproxy.service -u egress-proxies-operator-fence-retry.service) ||
    die "reading tinyproxy's journal through the guest agent failed"
  for want in "no global address after 60 s" "starting tinyproxy again" "egress fence loaded"; do
    [[ $journal == *"$want"* ]] || die "the guest's journal lacks \"$want\": the proxy did not come up through the fence's retry:
$journal"
  done
  log "the fence gave up waiting for the address, its retry started tinyproxy once the address came, behind the fence"
fi
echo "TIMING start->agent $(since "$t0" "$t1")s agent->proxy $(since "$t1" "$t2")s start->proxy $(since "$t0" "$t2")s"

# SMOKE_REBOOTS: every boot's network must come up, whatever networkd did on the way. The
# first boot above counts too. A boot whose proxy never answers is counted stuck, with
# networkd's view of it, and the boots go on; the script fails at the end if any was.
REBOOTS=${SMOKE_REBOOTS:-0}
((REBOOTS > 0)) || exit 0
boot_id() { guest_exec /bin/cat /proc/sys/kernel/random/boot_id 2>/dev/null | head -n 1; }
new_boot() { local b; b=$(boot_id) && [[ -n $b && $b != "$last_boot" ]]; }
boots=0 stuck=0 busy_boots=0 retries=0
count_boot() { # seconds: this boot's journal, counted
  local journal busy retried
  journal=$(guest_exec /usr/bin/journalctl -b -o cat --no-pager -u systemd-networkd.service -u egress-proxies-operator-link-retry.service) || journal=""
  busy=$(grep -c "Device or resource busy" <<<"$journal" || true)
  retried=$(grep -c "asking networkd to configure it again" <<<"$journal" || true)
  boots=$((boots + 1)) retries=$((retries + retried))
  ((busy > 0)) && busy_boots=$((busy_boots + 1))
  echo "BOOT $boots proxy-after ${1}s busy $busy link-retries $retried"
}
count_boot "$(since "$t0" "$t2")"
last_boot=$(boot_id)
for ((i = 1; i <= REBOOTS; i++)); do
  tr=$(now)
  "${VIRSH[@]}" reset "$NAME" >/dev/null
  if ! wait_until "$DEADLINE" "boot $((i + 1)) to start (a new boot id through the guest agent)" new_boot; then
    boots=$((boots + 1)) stuck=$((stuck + 1))
    echo "BOOT $boots stuck: the guest agent never answered with a new boot id"
    continue
  fi
  last_boot=$(boot_id)
  if ! wait_until "$DEADLINE" "boot $((i + 1)): a request through http://$ip:3128" through_proxy "$ip"; then
    boots=$((boots + 1)) stuck=$((stuck + 1))
    echo "BOOT $boots stuck: no answer through http://$ip:3128; networkd says:"
    guest_exec /usr/bin/networkctl list --no-pager || true
    continue
  fi
  count_boot "$(since "$tr" "$(now)")"
done
echo "BOOTS $boots stuck $stuck busy-boots $busy_boots link-retries $retries"
((stuck == 0)) || die "$stuck of $boots boots never served"
