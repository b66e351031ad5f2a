#!/usr/bin/env bash
# The operator end to end on this one machine: a local control plane (kube-apiserver and
# etcd), the local libvirt host, the guest image served on the bridge, and the manager, all
# started in the background; then the sample Proxy, followed until it is Ready. It ends by
# printing the kubectl commands (kubectl built into the cache, the API server's version)
# that add more Proxies and look at them.
#
#   hack/demo.sh up       set up and start what is missing, apply the sample, wait for Ready
#   hack/demo.sh down     delete every Proxy in the demo's cluster (and so their VMs), then
#                         stop what up started
#   hack/demo.sh status   what is running
#
# Everything up starts is recorded by pid file in ${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator/demo
# (logs beside them); down stops exactly those. The libvirt host stays up after down
# (hack/libvirt-host.sh down stops it). Re-running up with everything running only reports.
#
# down deletes the Proxies while the manager still runs, so their finalizers remove the VMs,
# and waits for them (until DEMO_DOWN_TIMEOUT, or the manager exits); only then does it
# stop the manager. The control plane records every
# Proxy it holds (namespace, name, UID) in proxies.json, and after the manager is stopped
# down removes, with the kvm2 provider's own Delete, any domain still carrying the mark of
# a recorded UID: one the manager could not remove in time, or all of them when the
# manager or the API server was already dead. The libvirt host is shared, so a domain whose
# mark names no recorded UID is never touched. down fails naming any domain left, with the
# virsh commands that remove it; the record stays until none is, so down can be re-run.
#
# Knobs: DEMO_IMAGE_PORT (18081), DEMO_DISCOVERY_PORT (18082), DEMO_METRICS_PORT (18080),
# DEMO_HEALTH_PORT (18083), DEMO_TIMEOUT (seconds to wait for Ready, 1800),
# DEMO_DOWN_TIMEOUT (seconds down waits for the Proxies to go, 900).
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HACK/.." && pwd)
# shellcheck disable=SC2034 # read by lib/common.sh
LOG_TAG=demo
# shellcheck source-path=SCRIPTDIR source=lib/common.sh disable=SC1091
source "$HACK/lib/common.sh"

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator
STATE=$CACHE/demo
IMAGE_PORT=${DEMO_IMAGE_PORT:-18081}
DISCOVERY_PORT=${DEMO_DISCOVERY_PORT:-18082}
METRICS_PORT=${DEMO_METRICS_PORT:-18080}
HEALTH_PORT=${DEMO_HEALTH_PORT:-18083}
TIMEOUT=${DEMO_TIMEOUT:-1800}
DOWN_TIMEOUT=${DEMO_DOWN_TIMEOUT:-900}
SAMPLE=$ROOT/config/samples/proxy_kvm2.yaml
PROXY_NAME=proxy-kvm2-sample
PROXY_NS=default
KUBECONFIG_PATH=$STATE/controlplane/kubeconfig
RECORD=$STATE/proxies.json
DEMOCTL=$ROOT/bin/democtl

# start NAME CMD...: common.sh's spawn with output to $STATE/NAME.log and the pid in
# $STATE/NAME.pid: CMD outlives this script and the terminal, and holds none of the
# caller's descriptors (a lock taken by `flock FILE make demo` must not stay held by the
# demo's processes until make demo-down).
start() {
  local name=$1
  shift
  spawn "$STATE/$name.pid" "$STATE/$name.log" "$@"
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
  (cd "$ROOT" && KUBEBUILDER_ASSETS=$ASSETS start controlplane "$DEMOCTL" controlplane --dir "$STATE/controlplane" --record "$RECORD")
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
  local ip port user pass k="$KUBECTL --kubeconfig $KUBECONFIG_PATH"
  ip=$("$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH" | awk -v n="$PROXY_NAME" '$2 == n { print $6 }')
  port=$(awk '$1 == "port:" { print $2; exit }' "$SAMPLE")
  # The sample's basic-auth Secret (stringData).
  user=$(awk '$1 == "username:" { print $2; exit }' "$SAMPLE")
  pass=$(awk '$1 == "password:" { print $2; exit }' "$SAMPLE")
  echo
  "$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH"
  cat <<EOF

The proxy is Ready. Try it from this machine (the discovery API's whoami answers with the
address the request came from, the guest's); without the sample Secret's credentials the
proxy answers 407:

  curl -x http://$user:$pass@$ip:$port http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami
  curl -si -x http://$ip:$port http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami | head -1

With kubectl (built into the cache, the API server's version):

  $k get proxies -A
  $k wait --for=condition=Ready proxy/$PROXY_NAME
  $k describe proxy $PROXY_NAME
  sed 's/^  name: $PROXY_NAME\$/  name: proxy-2/' $SAMPLE | $k apply -f -
  $k get proxies -w
  $k delete proxy proxy-2
  $k get providerhealths kvm2-home -o yaml

Discovery API:       curl http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/proxies?format=text
                     (URLs without credentials: the demo runs it without a token, and
                     credentials=true is served only with --discovery-token-file)
Kubeconfig:          $KUBECONFIG_PATH
Manager log:         $STATE/manager.log
Stop it all:         make demo-down   (deletes every Proxy, and so its VM, then stops the
                     demo; hack/libvirt-host.sh down stops the libvirt host too)
EOF
}

cmd_up() {
  mkdir -p "$STATE/controlplane"
  ensure_packages curl # the readiness checks below, and the command the demo ends with
  "$HACK/libvirt-host.sh" up
  # shellcheck disable=SC1091
  source "$CACHE/libvirt-host/env"
  log "kube-apiserver, etcd and kubectl (a first build takes about 20 minutes)"
  ASSETS=$("$HACK/envtest-assets.sh" kube-apiserver etcd kubectl)
  KUBECTL=$ASSETS/kubectl
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
  log "the Ready condition, as kubectl wait (and Flux or Argo CD) reads it:"
  "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" wait --namespace "$PROXY_NS" --for=condition=Ready "proxy/$PROXY_NAME" --timeout=120s ||
    die "the Proxy is Ready but its Ready condition is not True; see $STATE/manager.log"
  report
}

# delete_proxies deletes every Proxy of the demo's cluster, recording them first. With the
# manager running it waits for them to go: their finalizers have the manager delete the VMs.
delete_proxies() {
  if ! pid_alive "$STATE/controlplane.pid" || [[ ! -s $KUBECONFIG_PATH ]]; then
    log "the control plane is not running; what is left is found by the record of the Proxies it held"
    return 0
  fi
  if pid_alive "$STATE/manager.pid"; then
    log "deleting every Proxy in the cluster; the manager removes their VMs (waiting up to ${DOWN_TIMEOUT}s)"
    "$DEMOCTL" delete-all --kubeconfig "$KUBECONFIG_PATH" --record "$RECORD" \
      --manager-pid "$(<"$STATE/manager.pid")" --timeout "${DOWN_TIMEOUT}s" ||
      log "not every Proxy went (above); what is left is removed directly once the manager is stopped"
  else
    log "the manager is not running: deleting every Proxy, then removing their domains directly"
    "$DEMOCTL" delete-all --kubeconfig "$KUBECONFIG_PATH" --record "$RECORD" ||
      log "the API server did not take the deletes; going by the record"
  fi
}

# sweep_domains removes, with the kvm2 provider's Delete, every domain still marked with the
# UID of a recorded Proxy. Only those: the libvirt host is shared with the test tiers.
sweep_domains() {
  if [[ ! -s $RECORD ]]; then
    log "no Proxy recorded, so no domain of this demo's to look for"
    return 0
  fi
  if [[ ! -s $STATE/providers.yaml ]]; then
    log "error: $RECORD lists Proxies but $STATE/providers.yaml is missing, so their host cannot be reached;" \
      "look for their domains with: virsh -c qemu:///system list --all"
    return 1
  fi
  "$DEMOCTL" sweep --providers-config "$STATE/providers.yaml" --record "$RECORD" --kubeconfig "$KUBECONFIG_PATH"
}

cmd_down() {
  [[ -d $STATE ]] || { log "nothing to stop"; return 0; }
  [[ -x $DEMOCTL ]] || build
  delete_proxies
  stop manager # only now: until the Proxies are gone, their finalizers need it
  local swept=0
  sweep_domains || swept=$?
  stop image-server
  stop controlplane 60
  local p
  for p in etcd kube-apiserver; do # normally stopped by the control plane itself
    if pid_alive "$STATE/controlplane/$p.pid"; then kill "$(<"$STATE/controlplane/$p.pid")"; fi
    rm -f "$STATE/controlplane/$p.pid"
  done
  if ((swept != 0)); then
    die "the demo is stopped, but domains of it are left on the libvirt host (named above, with the" \
      "commands that remove them); make demo-down tries again, its record is $RECORD"
  fi
  log "demo stopped; the libvirt host is still up (hack/libvirt-host.sh down stops it;" \
    "the cached base image stays in its pool)"
}

cmd_status() {
  local n
  for n in controlplane image-server manager; do
    if pid_alive "$STATE/$n.pid"; then echo "$n: running (pid $(<"$STATE/$n.pid"))"; else echo "$n: stopped"; fi
  done
  if [[ -s $KUBECONFIG_PATH && -x $DEMOCTL ]]; then
    "$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH" 2>/dev/null || true
  fi
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
