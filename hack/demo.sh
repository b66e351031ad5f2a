#!/usr/bin/env bash
# The operator end to end on this one machine: a local control plane (kube-apiserver and
# etcd), the local libvirt host, the guest image served on the bridge, and the manager, all
# started in the background; then the sample Proxy, followed until it is Ready.
#
#   hack/demo.sh up       set up and start what is missing, apply the sample, wait for Ready
#   hack/demo.sh down     delete the sample Proxy (and so its VM), stop what up started
#   hack/demo.sh status   what is running
#
# Everything up starts is recorded by pid file in ${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator/demo
# (logs beside them); down stops exactly those. The libvirt host stays up after down
# (hack/libvirt-host.sh down stops it). Re-running up with everything running only reports.
#
# Knobs: DEMO_IMAGE_PORT (18081), DEMO_DISCOVERY_PORT (18082), DEMO_METRICS_PORT (18080),
# DEMO_HEALTH_PORT (18083), DEMO_TIMEOUT (seconds to wait for Ready, 1800).
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HACK/.." && pwd)
LOG_TAG=demo
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator
STATE=$CACHE/demo
IMAGE_PORT=${DEMO_IMAGE_PORT:-18081}
DISCOVERY_PORT=${DEMO_DISCOVERY_PORT:-18082}
METRICS_PORT=${DEMO_METRICS_PORT:-18080}
HEALTH_PORT=${DEMO_HEALTH_PORT:-18083}
TIMEOUT=${DEMO_TIMEOUT:-1800}
SAMPLE=$ROOT/config/samples/proxy_kvm2.yaml
PROXY_NAME=proxy-kvm2-sample
PROXY_NS=default
KUBECONFIG_PATH=$STATE/controlplane/kubeconfig
DEMOCTL=$ROOT/bin/democtl

# start NAME CMD...: runs CMD in a session of its own (so it outlives this script and the
# terminal), output to $STATE/NAME.log, pid in $STATE/NAME.pid. Not a process group leader
# here, setsid execs CMD in place, so $! is CMD's own pid.
start() {
  local name=$1
  shift
  setsid "$@" >>"$STATE/$name.log" 2>&1 </dev/null &
  echo $! >"$STATE/$name.pid"
}

stop() { # NAME [seconds before SIGKILL]
  local name=$1 grace=${2:-30} pid
  if pid_alive "$STATE/$name.pid"; then
    pid=$(<"$STATE/$name.pid")
    kill "$pid"
    if ! wait_until "$grace" "$name (pid $pid) to exit" bash -c "! kill -0 $pid"; then
      kill -9 "$pid" 2>/dev/null || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$STATE/$name.pid"
}

build() {
  log "building bin/manager and bin/democtl"
  (cd "$ROOT" && go build -o bin/manager ./cmd/manager && go build -o bin/democtl ./hack/democtl)
}

start_controlplane() {
  if pid_alive "$STATE/controlplane.pid" && [[ -s $KUBECONFIG_PATH ]]; then
    log "control plane already running (pid $(<"$STATE/controlplane.pid"))"
    return 0
  fi
  rm -f "$KUBECONFIG_PATH"
  (cd "$ROOT" && KUBEBUILDER_ASSETS=$ASSETS start controlplane "$DEMOCTL" controlplane --dir "$STATE/controlplane")
  wait_until 300 "the control plane's kubeconfig" test -s "$KUBECONFIG_PATH" ||
    { tail -n 20 "$STATE/controlplane.log" >&2; die "the control plane did not come up"; }
  log "control plane up (kube-apiserver pid $(<"$STATE/controlplane/kube-apiserver.pid"), etcd pid $(<"$STATE/controlplane/etcd.pid")); kubeconfig $KUBECONFIG_PATH"
}

start_image_server() {
  if pid_alive "$STATE/image-server.pid"; then
    log "image server already running (pid $(<"$STATE/image-server.pid"))"
    return 0
  fi
  start image-server "$DEMOCTL" serve-image --addr "$KVM2_TEST_BRIDGE_IP:$IMAGE_PORT" --file "$IMAGE"
  wait_until 30 "the image server on $KVM2_TEST_BRIDGE_IP:$IMAGE_PORT" \
    curl -fsI "http://$KVM2_TEST_BRIDGE_IP:$IMAGE_PORT/guest.qcow2" ||
    { tail -n 5 "$STATE/image-server.log" >&2; die "the image server did not start"; }
  log "serving $IMAGE at http://$KVM2_TEST_BRIDGE_IP:$IMAGE_PORT/guest.qcow2"
}

# The provider and catalogue names are those config/samples/proxy_kvm2.yaml uses.
write_providers_config() {
  cat >"$STATE/providers.yaml" <<EOF
providers:
  - name: kvm2-home
    type: kvm2
    kvm2:
      sshKeyFile: $KVM2_TEST_KEY
      knownHostsFile: $KVM2_TEST_KNOWN_HOSTS
      diskSizeGb: 4
      images:
        debian-12:
          url: http://$KVM2_TEST_BRIDGE_IP:$IMAGE_PORT/guest.qcow2
          sha256: $(cut -d' ' -f1 "$IMAGE.sha256")
          format: qcow2
          firmware: uefi
      machineTypes:
        small: {vcpus: 2, memoryMiB: 1024}
      hosts:
        - name: local
          address: $KVM2_TEST_ADDRESS
          user: $KVM2_TEST_USER
          socket: $KVM2_TEST_SOCKET
          pool: $KVM2_TEST_POOL
          bridge: $KVM2_TEST_BRIDGE
          domainType: $KVM2_TEST_DOMAIN_TYPE
EOF
}

start_manager() {
  if pid_alive "$STATE/manager.pid"; then
    log "manager already running (pid $(<"$STATE/manager.pid")); make demo-down first to run a rebuilt one"
    return 0
  fi
  write_providers_config
  # The probe target is the manager's own whoami endpoint on the bridge, the one address
  # guests may reach. The local host is shared with the test tiers, so orphan GC only
  # collects what has been orphaned for a day.
  start manager "$ROOT/bin/manager" --providers-config="$STATE/providers.yaml" --kubeconfig="$KUBECONFIG_PATH" \
    --metrics-bind-address="127.0.0.1:$METRICS_PORT" --health-probe-bind-address="127.0.0.1:$HEALTH_PORT" \
    --discovery-bind-address="$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT" \
    --proxy-probe-url="http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami" \
    --proxy-check-interval=10s --provider-check-interval=30s --gc-grace=24h
  wait_until 120 "the manager's /readyz" curl -fs "http://127.0.0.1:$HEALTH_PORT/readyz" ||
    { tail -n 20 "$STATE/manager.log" >&2; die "the manager did not become ready"; }
  log "manager running (pid $(<"$STATE/manager.pid")), log $STATE/manager.log"
}

report() {
  local ip port
  ip=$("$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH" | awk -v n="$PROXY_NAME" '$2 == n { print $6 }')
  port=$(awk '$1 == "port:" { print $2; exit }' "$SAMPLE")
  echo
  "$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH"
  cat <<EOF

The proxy is Ready. Try it from this machine (the discovery API's whoami answers with the
address the request came from, the guest's):

  curl -x http://$ip:$port http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami

Discovery API:       curl http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/proxies?format=text
Kubeconfig:          $KUBECONFIG_PATH   (kubectl --kubeconfig $KUBECONFIG_PATH get px, if you have kubectl)
Manager log:         $STATE/manager.log
Stop it all:         make demo-down   (then hack/libvirt-host.sh down to stop the libvirt host too)
EOF
}

cmd_up() {
  mkdir -p "$STATE/controlplane"
  ensure_packages curl # the readiness checks below, and the command the demo ends with
  "$HACK/libvirt-host.sh" up
  # shellcheck disable=SC1091
  source "$CACHE/libvirt-host/env"
  log "envtest binaries (a first build takes about 15 minutes)"
  ASSETS=$("$HACK/envtest-assets.sh")
  log "guest image (a first build takes about 6 minutes)"
  IMAGE=$("$HACK/guest-image.sh")
  build
  start_controlplane
  start_image_server
  start_manager
  "$DEMOCTL" apply --kubeconfig "$KUBECONFIG_PATH" --namespace "$PROXY_NS" -f "$SAMPLE"
  log "waiting for $PROXY_NS/$PROXY_NAME to be Ready (the guest boots under emulation when there is no KVM: minutes)"
  "$DEMOCTL" wait --kubeconfig "$KUBECONFIG_PATH" --namespace "$PROXY_NS" --name "$PROXY_NAME" --timeout "${TIMEOUT}s" ||
    die "see $STATE/manager.log"
  report
}

cmd_down() {
  [[ -d $STATE ]] || { log "nothing to stop"; return 0; }
  local vm
  vm=$("$DEMOCTL" instance-name --namespace "$PROXY_NS" --name "$PROXY_NAME" 2>/dev/null || true)
  if pid_alive "$STATE/manager.pid" && [[ -s $KUBECONFIG_PATH ]]; then
    log "deleting $PROXY_NS/$PROXY_NAME; the operator removes its VM"
    "$DEMOCTL" delete --kubeconfig "$KUBECONFIG_PATH" --namespace "$PROXY_NS" --name "$PROXY_NAME" --timeout 10m ||
      log "the operator did not finish deleting it; removing the VM directly"
  fi
  if [[ -n $vm ]] && virsh -q -c qemu:///system dominfo "$vm" >/dev/null 2>&1; then
    virsh -q -c qemu:///system destroy "$vm" >/dev/null 2>&1 || true
    virsh -q -c qemu:///system undefine --nvram "$vm" >/dev/null 2>&1 || true
    for v in "$vm.qcow2" "$vm-seed.iso"; do
      virsh -q -c qemu:///system vol-delete --pool default "$v" >/dev/null 2>&1 || true
    done
    log "removed VM $vm directly"
  fi
  stop manager
  stop image-server
  stop controlplane 60
  local p
  for p in etcd kube-apiserver; do # normally stopped by the control plane itself
    [[ -f $STATE/controlplane/$p.pid ]] && pid_alive "$STATE/controlplane/$p.pid" && kill "$(<"$STATE/controlplane/$p.pid")"
    rm -f "$STATE/controlplane/$p.pid"
  done
  log "demo stopped; the libvirt host is still up (hack/libvirt-host.sh down stops it;" \
    "the cached base image stays in its pool)"
}

cmd_status() {
  local n
  for n in controlplane image-server manager; do
    if pid_alive "$STATE/$n.pid"; then echo "$n: running (pid $(<"$STATE/$n.pid"))"; else echo "$n: stopped"; fi
  done
  [[ -s $KUBECONFIG_PATH && -x $DEMOCTL ]] && "$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH" 2>/dev/null || true
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
  ;;
esac
