#!/usr/bin/env bash
# The operator end to end on this one machine: a local control plane (kube-apiserver and
# etcd), the local libvirt host, the guest image served on the bridge, the manager and the
# gateway, all started in the background; then the sample Proxy, followed until it is
# Ready. It ends with a request through the proxy directly and the same through the
# gateway, and prints the kubectl commands (kubectl built into the cache, the API server's version)
# that add more Proxies and look at them.
#
#   hack/demo.sh up           set up and start what is missing, apply the sample, wait for Ready
#   hack/demo.sh up-external  the same without VMs (make demo-external): the control plane, three
#                             tinyproxy forward proxies on loopback as External Proxies, and the
#                             manager without a providers config and the gateway, ending with
#                             discovery answering and a request through the gateway
#   hack/demo.sh down         delete every Proxy in the demo's cluster (and so their VMs), then
#                             stop what up or up-external started
#   hack/demo.sh status       what is running
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
# Before starting anything, up and up-external check that every port they are about to
# listen on is free, and fail naming each one taken with the process holding it (pid and
# command line). A manager that exits before it is ready ends the wait at once, with the last
# error line of its log.
#
# Knobs: DEMO_IMAGE_PORT (18081), DEMO_DISCOVERY_PORT (18082), DEMO_METRICS_PORT (18080),
# DEMO_HEALTH_PORT (18083), DEMO_PROXY_PORT (18090, up-external: the port of the three
# tinyproxies on 127.0.0.2, .3 and .4), DEMO_GATEWAY_PORT (18084, the gateway's HTTP proxy
# port on 127.0.0.1), DEMO_GATEWAY_SOCKS_PORT (18085), DEMO_GATEWAY_HEALTH_PORT (18086),
# DEMO_TIMEOUT (seconds to wait for Ready, 1800;
# up-external 120), DEMO_DOWN_TIMEOUT (seconds down waits for the Proxies to go, 900),
# DEMO_STATE (the state directory, ${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator/demo).
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HACK/.." && pwd)
# shellcheck disable=SC2034 # read by lib/common.sh
LOG_TAG=demo
# shellcheck source-path=SCRIPTDIR source=lib/common.sh disable=SC1091
source "$HACK/lib/common.sh"

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator
STATE=${DEMO_STATE:-$CACHE/demo}
IMAGE_PORT=${DEMO_IMAGE_PORT:-18081}
DISCOVERY_PORT=${DEMO_DISCOVERY_PORT:-18082}
METRICS_PORT=${DEMO_METRICS_PORT:-18080}
HEALTH_PORT=${DEMO_HEALTH_PORT:-18083}
PROXY_PORT=${DEMO_PROXY_PORT:-18090}
GATEWAY_PORT=${DEMO_GATEWAY_PORT:-18084}
GATEWAY_SOCKS_PORT=${DEMO_GATEWAY_SOCKS_PORT:-18085}
GATEWAY_HEALTH_PORT=${DEMO_GATEWAY_HEALTH_PORT:-18086}
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

# wait_started NAME SECS WHAT CMD...: runs CMD until it succeeds; when the process NAME
# (started by start) exits first, or SECS pass, it prints the end of NAME's log and dies at
# once, rather than waiting out SECS for a process that is gone.
wait_started() {
  local name=$1 secs=$2 what=$3
  shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ! pid_alive "$STATE/$name.pid"; then
      tail -n 10 "$STATE/$name.log" >&2
      die "$name exited before $what (above, the end of its log $STATE/$name.log)"
    fi
    if ((SECONDS >= deadline)); then
      tail -n 10 "$STATE/$name.log" >&2
      die "gave up after ${secs}s waiting for $what (above, the end of $STATE/$name.log)"
    fi
    sleep 0.2
  done
}

build() {
  log "building bin/manager, bin/gateway and bin/democtl"
  (cd "$ROOT" && go build -o bin/manager ./cmd/manager && go build -o bin/gateway ./cmd/gateway &&
    go build -o bin/democtl ./hack/democtl)
}

start_controlplane() {
  if pid_alive "$STATE/controlplane.pid" && [[ -s $KUBECONFIG_PATH ]]; then
    log "control plane already running (pid $(<"$STATE/controlplane.pid"))"
    return 0
  fi
  rm -f "$KUBECONFIG_PATH"
  (cd "$ROOT" && KUBEBUILDER_ASSETS=$ASSETS start controlplane "$DEMOCTL" controlplane --dir "$STATE/controlplane" --record "$RECORD")
  wait_started controlplane 300 "the control plane's kubeconfig" test -s "$KUBECONFIG_PATH"
  log "control plane up (kube-apiserver pid $(<"$STATE/controlplane/kube-apiserver.pid"), etcd pid $(<"$STATE/controlplane/etcd.pid")); kubeconfig $KUBECONFIG_PATH"
}

start_image_server() {
  if pid_alive "$STATE/image-server.pid"; then
    log "image server already running (pid $(<"$STATE/image-server.pid"))"
    return 0
  fi
  start image-server "$DEMOCTL" serve-image --addr "$KVM2_TEST_BRIDGE_IP:$IMAGE_PORT" --file "$IMAGE"
  wait_started image-server 30 "the image server on $KVM2_TEST_BRIDGE_IP:$IMAGE_PORT" \
    curl -fsI "http://$KVM2_TEST_BRIDGE_IP:$IMAGE_PORT/guest.qcow2"
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
  ensure_token
  # The probe target is the manager's own whoami endpoint on the bridge, the one address
  # guests may reach. The local host is shared with the test tiers, so orphan GC only
  # collects what has been orphaned for a day.
  start manager "$ROOT/bin/manager" --providers-config="$STATE/providers.yaml" --kubeconfig="$KUBECONFIG_PATH" \
    --metrics-bind-address="127.0.0.1:$METRICS_PORT" --health-probe-bind-address="127.0.0.1:$HEALTH_PORT" \
    --discovery-bind-address="$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT" --discovery-token-file="$STATE/discovery-token" \
    --proxy-probe-url="http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami" \
    --proxy-check-interval=10s --provider-check-interval=30s --gc-grace=24h
  wait_manager
}

# wait_manager waits for the manager's /readyz, and stops at once when the manager exits,
# with the last error line of its log.
wait_manager() {
  "$DEMOCTL" wait-ready --url "http://127.0.0.1:$HEALTH_PORT/readyz" --pid "$(<"$STATE/manager.pid")" \
    --log "$STATE/manager.log" --timeout 120s ||
    die "the manager did not become ready (above); its log is $STATE/manager.log"
  log "manager running (pid $(<"$STATE/manager.pid")), log $STATE/manager.log"
}

# start_gateway: the gateway (cmd/gateway) on 127.0.0.1, reading the control plane as the
# manager does; its proxy password is the discovery token.
start_gateway() {
  if pid_alive "$STATE/gateway.pid"; then
    log "gateway already running (pid $(<"$STATE/gateway.pid"))"
    return 0
  fi
  start gateway "$ROOT/bin/gateway" --kubeconfig="$KUBECONFIG_PATH" \
    --listen-address="127.0.0.1:$GATEWAY_PORT" --socks-listen-address="127.0.0.1:$GATEWAY_SOCKS_PORT" \
    --metrics-bind-address=0 --health-probe-bind-address="127.0.0.1:$GATEWAY_HEALTH_PORT" \
    --discovery-token-file="$STATE/discovery-token" --discovery-kubernetes-auth=false
  "$DEMOCTL" wait-ready --url "http://127.0.0.1:$GATEWAY_HEALTH_PORT/readyz" --pid "$(<"$STATE/gateway.pid")" \
    --log "$STATE/gateway.log" --timeout 120s ||
    die "the gateway did not become ready (above); its log is $STATE/gateway.log"
  log "gateway running (pid $(<"$STATE/gateway.pid")) on 127.0.0.1:$GATEWAY_PORT (SOCKS5 $GATEWAY_SOCKS_PORT), log $STATE/gateway.log"
}

# through_gateway NAMESPACE URL: a request through the gateway, with the headers that name
# the exit it took; fails unless it answers 200.
through_gateway() {
  local ns=$1 url=$2 out
  out=$(curl -s -i --max-time 60 -x "http://demo+ns=$ns:$(<"$STATE/discovery-token")@127.0.0.1:$GATEWAY_PORT" "$url") ||
    die "curl through the gateway failed; its log is $STATE/gateway.log"
  printf '%s\n' "$out" | tr -d '\r' | grep -iE '^(HTTP/|x-egress-)' | sed 's/^/  /'
  printf '%s\n' "$out" | tr -d '\r' | sed -n '/^$/,$p' | sed '/^$/d; s/^/  /'
  printf '%s\n' "$out" | head -1 | grep -q ' 200' || die "the gateway did not answer 200; its log is $STATE/gateway.log"
}

# ensure_token: the discovery API's static bearer token (--discovery-token-file), made once.
ensure_token() {
  [[ -s $STATE/discovery-token ]] || head -c 24 /dev/urandom | base64 | tr -d '/+=\n' >"$STATE/discovery-token"
  chmod 0600 "$STATE/discovery-token"
}

# check_ports NAME WHAT=HOST:PORT...: fails naming every address in use and what holds it,
# unless the demo's own NAME is already running (then they are its own).
check_ports() {
  local name=$1
  shift
  if pid_alive "$STATE/$name.pid"; then
    return 0
  fi
  "$DEMOCTL" check-ports "$@" || die "choose other ports with the variables named above (hack/demo.sh's Knobs), or stop what holds them"
}

check_gateway_ports() {
  check_ports gateway "gateway (DEMO_GATEWAY_PORT)=127.0.0.1:$GATEWAY_PORT" \
    "gateway SOCKS5 (DEMO_GATEWAY_SOCKS_PORT)=127.0.0.1:$GATEWAY_SOCKS_PORT" \
    "gateway health probes (DEMO_GATEWAY_HEALTH_PORT)=127.0.0.1:$GATEWAY_HEALTH_PORT"
}

# check_mode MODE: up and up-external share the state directory and the ports, so one
# runs at a time.
check_mode() {
  local mode=$1 running
  running=$(cat "$STATE/mode" 2>/dev/null || echo vm)
  if pid_alive "$STATE/manager.pid" && [[ $running != "$mode" ]]; then
    die "the $running demo is running (its manager pid $(<"$STATE/manager.pid")); make demo-down first"
  fi
  echo "$mode" >"$STATE/mode"
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
  echo
  log "the proxy directly (whoami answers with the address it saw, the guest's):"
  curl -s --max-time 60 -x "http://$user:$pass@$ip:$port" "http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami" | sed 's/^/  /' ||
    die "curl through the proxy at $ip:$port failed"
  log "the same through the gateway, which chose the exit and names it:"
  through_gateway "$PROXY_NS" "http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami"
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

Through the gateway (one proxy URL for every crawler; docs/gateway.md), with the
discovery token as the password and options in the user name:

  curl -i -x "http://demo+ns=$PROXY_NS:\$(cat $STATE/discovery-token)@127.0.0.1:$GATEWAY_PORT" http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami
  curl --socks5-hostname "demo+ns=$PROXY_NS:\$(cat $STATE/discovery-token)@127.0.0.1:$GATEWAY_SOCKS_PORT" http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT/v1/whoami

Discovery API:       export API=http://$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT TOKEN=\$(cat $STATE/discovery-token)
                     curl -s -H "Authorization: Bearer \$TOKEN" "\$API/v1/proxies?format=text"
                     (docs/discovery.md's examples, with \$API for http://proxy-operator:8082)
Kubeconfig:          $KUBECONFIG_PATH
Manager log:         $STATE/manager.log
Gateway log:         $STATE/gateway.log
Stop it all:         make demo-down   (deletes every Proxy, and so its VM, then stops the
                     demo; hack/libvirt-host.sh down stops the libvirt host too)
EOF
}

cmd_up() {
  mkdir -p "$STATE/controlplane"
  ensure_packages curl # the readiness checks below, and the command the demo ends with
  build
  check_mode vm
  check_ports manager "metrics (DEMO_METRICS_PORT)=127.0.0.1:$METRICS_PORT" "health probes (DEMO_HEALTH_PORT)=127.0.0.1:$HEALTH_PORT"
  "$HACK/libvirt-host.sh" up
  # shellcheck disable=SC1091
  source "$CACHE/libvirt-host/env"
  check_ports manager "discovery (DEMO_DISCOVERY_PORT)=$KVM2_TEST_BRIDGE_IP:$DISCOVERY_PORT"
  check_ports image-server "image server (DEMO_IMAGE_PORT)=$KVM2_TEST_BRIDGE_IP:$IMAGE_PORT"
  check_gateway_ports
  log "kube-apiserver, etcd and kubectl (a first build takes about 20 minutes)"
  ASSETS=$("$HACK/envtest-assets.sh" kube-apiserver etcd kubectl)
  KUBECTL=$ASSETS/kubectl
  log "guest image (a first build takes about 6 minutes)"
  IMAGE=$("$HACK/guest-image.sh")
  start_controlplane
  start_image_server
  start_manager
  start_gateway
  "$DEMOCTL" apply --kubeconfig "$KUBECONFIG_PATH" --namespace "$PROXY_NS" -f "$SAMPLE"
  log "waiting for $PROXY_NS/$PROXY_NAME to be Ready (the guest boots under emulation when there is no KVM: minutes)"
  "$DEMOCTL" wait --kubeconfig "$KUBECONFIG_PATH" --namespace "$PROXY_NS" --name "$PROXY_NAME" --timeout "${TIMEOUT}s" ||
    die "see $STATE/manager.log"
  log "the Ready condition, as kubectl wait (and Flux or Argo CD) reads it:"
  "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" wait --namespace "$PROXY_NS" --for=condition=Ready "proxy/$PROXY_NAME" --timeout=120s ||
    die "the Proxy is Ready but its Ready condition is not True; see $STATE/manager.log"
  report
}

# The VM-less demo (up-external). Three forward proxies, Debian's tinyproxy, listen on
# 127.0.0.2, .3 and .4 at DEMO_PROXY_PORT and demand basic auth; crawler-1 leaves from
# 127.0.0.2 and crawler-2 from 127.0.0.3, and crawler-3 leaves from crawler-2's address,
# 127.0.0.3, like two VMs behind one NAT. They are the External Proxies crawl/crawler-1..3
# (crawler-1 and crawler-2 labelled pool=news), the names docs/discovery.md's examples use.
EXT_NS=crawl
EXT_USER=crawler
EXT_PASS=Xk9-q.Tr_22
EXT_NAMES=(crawler-1 crawler-2 crawler-3)
EXT_LISTEN=(127.0.0.2 127.0.0.3 127.0.0.4)
EXT_EGRESS=(127.0.0.2 127.0.0.3 127.0.0.3)

start_tinyproxies() {
  local i name
  for i in "${!EXT_NAMES[@]}"; do
    name=tinyproxy-${EXT_NAMES[$i]}
    if pid_alive "$STATE/$name.pid" tinyproxy; then
      log "$name already running (pid $(<"$STATE/$name.pid"))"
      continue
    fi
    cat >"$STATE/$name.conf" <<EOF
User nobody
Group nogroup
Port $PROXY_PORT
Listen ${EXT_LISTEN[$i]}
Bind ${EXT_EGRESS[$i]}
Timeout 60
MaxClients 100
LogLevel Notice
BasicAuth $EXT_USER $EXT_PASS
DisableViaHeader Yes
EOF
    start "$name" tinyproxy -d -c "$STATE/$name.conf"
  done
  for i in "${!EXT_NAMES[@]}"; do
    name=tinyproxy-${EXT_NAMES[$i]}
    # Without credentials a tinyproxy that is up answers 407.
    wait_started "$name" 30 "$name on ${EXT_LISTEN[$i]}:$PROXY_PORT" \
      bash -c "curl -s -o /dev/null -w '%{http_code}' -x http://${EXT_LISTEN[$i]}:$PROXY_PORT http://127.0.0.1:1/ | grep -q 407"
  done
  log "tinyproxy on ${EXT_LISTEN[*]} port $PROXY_PORT (pids $(cat "$STATE"/tinyproxy-*.pid | tr '\n' ' '))"
}

write_external_manifest() {
  local i labels
  cat <<EOF
apiVersion: v1
kind: Namespace
metadata:
  name: $EXT_NS
---
apiVersion: v1
kind: Secret
metadata:
  name: proxy-auth
  namespace: $EXT_NS
  labels:
    egress.hrajfrisbee.cz/proxy-credentials: "true"
stringData:
  username: $EXT_USER
  password: $EXT_PASS
EOF
  for i in "${!EXT_NAMES[@]}"; do
    labels={}
    ((i < 2)) && labels='{pool: news}'
    cat <<EOF
---
apiVersion: egress.hrajfrisbee.cz/v1alpha1
kind: Proxy
metadata:
  name: ${EXT_NAMES[$i]}
  namespace: $EXT_NS
  labels: $labels
spec:
  mode: External
  address: ${EXT_LISTEN[$i]}
  port: $PROXY_PORT
  proxy:
    basicAuth:
      secretRef:
        name: proxy-auth
EOF
  done
}

start_external_manager() {
  if pid_alive "$STATE/manager.pid"; then
    log "manager already running (pid $(<"$STATE/manager.pid")); make demo-down first to run a rebuilt one"
    return 0
  fi
  ensure_token
  # --providers-config= : no providers, whatever is at the default path on this machine.
  start manager "$ROOT/bin/manager" --providers-config= --kubeconfig="$KUBECONFIG_PATH" \
    --metrics-bind-address="127.0.0.1:$METRICS_PORT" --health-probe-bind-address="127.0.0.1:$HEALTH_PORT" \
    --discovery-bind-address="127.0.0.1:$DISCOVERY_PORT" --discovery-token-file="$STATE/discovery-token" \
    --proxy-probe-url="http://127.0.0.1:$DISCOVERY_PORT/v1/whoami" --proxy-check-interval=2s
  wait_manager
}

# discovery_lists_all: discovery hands out every External Proxy, healthy.
discovery_lists_all() {
  local n
  n=$(curl -fs -H "Authorization: Bearer $(<"$STATE/discovery-token")" \
    "http://127.0.0.1:$DISCOVERY_PORT/v1/proxies?namespace=$EXT_NS&format=text" | grep -c '^http://') || return 1
  ((n == ${#EXT_NAMES[@]}))
}

report_external() {
  local api=http://127.0.0.1:$DISCOVERY_PORT k="$KUBECTL --kubeconfig $KUBECONFIG_PATH"
  echo
  "$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH"
  echo
  log "a picked proxy directly (whoami answers with the address it saw):"
  curl -s --max-time 60 -x "$(curl -s -H "Authorization: Bearer $(<"$STATE/discovery-token")" \
    "$api/v1/proxies/pick?key=example.com&credentials=true&format=text")" "$api/v1/whoami" | sed 's/^/  /' ||
    die "curl through a picked proxy failed"
  log "through the gateway, which chose the exit and names it:"
  through_gateway "$EXT_NS" "$api/v1/whoami"
  cat <<EOF

Discovery hands out the three External Proxies: tinyproxy on ${EXT_LISTEN[*]} port
$PROXY_PORT, with basic auth ($EXT_USER / $EXT_PASS, the Secret $EXT_NS/proxy-auth). The
manager runs with no providers config, so a Managed Proxy here fails with reason
ProviderNotConfigured. The API is at $api behind the token in $STATE/discovery-token:

  export API=$api TOKEN=\$(cat $STATE/discovery-token)
  curl -s -H "Authorization: Bearer \$TOKEN" "\$API/v1/proxies?format=text"
  curl -s -H "Authorization: Bearer \$TOKEN" "\$API/v1/proxies/pick?domain=shop.example.com"
  # through a picked proxy, with its credentials; whoami answers with its egress address
  curl -s -x "\$(curl -s -H "Authorization: Bearer \$TOKEN" "\$API/v1/proxies/pick?key=example.com&credentials=true&format=text")" "\$API/v1/whoami"
  # feedback: crawler-1 banned on shop.example.com; ?domain=shop.example.com leaves it out
  curl -s -X POST "\$API/v1/feedback" -H "Authorization: Bearer \$TOKEN" -H 'Content-Type: application/json' \\
    -d '{"reports":[{"proxy":"$EXT_NS/crawler-1","domain":"shop.example.com","outcome":"banned"}]}'

The gateway: one proxy URL, the discovery token as its password, options in the user
name (docs/gateway.md); session=NAME keeps one exit:

  curl -i -x "http://demo+ns=$EXT_NS+session=s1:\$TOKEN@127.0.0.1:$GATEWAY_PORT" "\$API/v1/whoami"
  curl --socks5-hostname "demo+ns=$EXT_NS:\$TOKEN@127.0.0.1:$GATEWAY_SOCKS_PORT" "\$API/v1/whoami"

Every example of docs/discovery.md runs as written with \$API in place of
http://proxy-operator:8082. The clients: pkg/client with client.Config{URL: "$api",
Token: ...}; Scrapy with EGRESS_PROXIES_URL = "$api" and
EGRESS_PROXIES_TOKEN_FILE = "$STATE/discovery-token".

With kubectl (built into the cache, the API server's version):

  $k -n $EXT_NS get proxies
  $k -n $EXT_NS get proxy crawler-1 -o yaml

Kubeconfig:          $KUBECONFIG_PATH
Manager log:         $STATE/manager.log
Gateway log:         $STATE/gateway.log
Stop it all:         make demo-down
EOF
}

cmd_up_external() {
  mkdir -p "$STATE/controlplane"
  # tinyproxy's own service is kept from starting; jq for the docs' examples.
  ensure_packages curl tinyproxy jq
  build
  check_mode external
  local ports=() i
  for i in "${!EXT_NAMES[@]}"; do
    pid_alive "$STATE/tinyproxy-${EXT_NAMES[$i]}.pid" || ports+=("proxy ${EXT_NAMES[$i]} (DEMO_PROXY_PORT)=${EXT_LISTEN[$i]}:$PROXY_PORT")
  done
  ((${#ports[@]} == 0)) || check_ports none "${ports[@]}"
  check_ports manager "metrics (DEMO_METRICS_PORT)=127.0.0.1:$METRICS_PORT" "health probes (DEMO_HEALTH_PORT)=127.0.0.1:$HEALTH_PORT" \
    "discovery (DEMO_DISCOVERY_PORT)=127.0.0.1:$DISCOVERY_PORT"
  check_gateway_ports
  ASSETS=$("$HACK/envtest-assets.sh" kube-apiserver etcd kubectl)
  KUBECTL=$ASSETS/kubectl
  start_controlplane
  start_tinyproxies
  start_external_manager
  start_gateway
  write_external_manifest >"$STATE/external-proxies.yaml"
  "$KUBECTL" --kubeconfig "$KUBECONFIG_PATH" apply -f "$STATE/external-proxies.yaml"
  log "waiting for discovery to hand out ${EXT_NAMES[*]} (the manager probes each through its proxy)"
  wait_until "${DEMO_TIMEOUT:-120}" "discovery to hand out the three proxies" discovery_lists_all ||
    { "$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH" >&2; tail -n 20 "$STATE/manager.log" >&2; die "see $STATE/manager.log"; }
  report_external
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
  local mode
  mode=$(cat "$STATE/mode" 2>/dev/null || echo vm)
  [[ -x $DEMOCTL ]] || build
  stop gateway
  delete_proxies
  stop manager # only now: until the Proxies are gone, their finalizers need it
  local swept=0
  sweep_domains || swept=$?
  stop image-server
  local tp tps=()
  for tp in "$STATE"/tinyproxy-*.pid; do
    [[ -e $tp ]] || continue
    tp=${tp##*/}
    tps+=("${tp%.pid}")
    if pid_alive "$STATE/$tp"; then kill "$(<"$STATE/$tp")"; fi # all at once; stop waits for each
  done
  for tp in "${tps[@]}"; do stop "$tp"; done
  stop controlplane 60
  local p
  for p in etcd kube-apiserver; do # normally stopped by the control plane itself
    if pid_alive "$STATE/controlplane/$p.pid"; then kill "$(<"$STATE/controlplane/$p.pid")"; fi
    rm -f "$STATE/controlplane/$p.pid"
  done
  rm -f "$STATE/mode"
  if ((swept != 0)); then
    die "the demo is stopped, but domains of it are left on the libvirt host (named above, with the" \
      "commands that remove them); make demo-down tries again, its record is $RECORD"
  fi
  if [[ $mode == external ]]; then
    log "demo stopped"
    return 0
  fi
  log "demo stopped; the libvirt host is still up (hack/libvirt-host.sh down stops it;" \
    "the cached base image stays in its pool)"
}

cmd_status() {
  local n
  for n in controlplane image-server manager gateway tinyproxy-crawler-1 tinyproxy-crawler-2 tinyproxy-crawler-3; do
    if pid_alive "$STATE/$n.pid"; then echo "$n: running (pid $(<"$STATE/$n.pid"))"; else echo "$n: stopped"; fi
  done
  if [[ -s $KUBECONFIG_PATH && -x $DEMOCTL ]]; then
    "$DEMOCTL" get --kubeconfig "$KUBECONFIG_PATH" 2>/dev/null || true
  fi
}

case ${1:-} in
up) cmd_up ;;
up-external) cmd_up_external ;;
down) cmd_down ;;
status) cmd_status ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
  ;;
esac
