#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, for make test-deploy: etcd,
# kube-apiserver (Node and RBAC authorization, service-account signing keys, its own CA),
# kube-controller-manager, kube-scheduler, containerd with runc and a static CNI bridge,
# a kubelet and kube-proxy (nftables mode), all run by hand without systemd.
#
#   hack/cluster.sh up       install and build what is missing, start what is not running (idempotent)
#   hack/cluster.sh down     delete every pod, stop what up started, remove its bridge, rules,
#                            mounts, network namespaces and cgroups
#   hack/cluster.sh status   one line per part; exit 0 when everything is up
#   hack/cluster.sh env      print the env file (KUBECONFIG and the addresses; source it)
#   hack/cluster.sh import TARBALL...
#                            import image tarballs (docker save or OCI) into the node's containerd
#
# The Kubernetes binaries come from hack/envtest-assets.sh (k8s.io/kubernetes at the envtest
# version, built once into the cache); containerd, runc and the CNI plugins from Debian.
# State: ${XDG_CACHE_HOME:-~/.cache}/egress-proxies-operator/cluster (certificates,
# kubeconfigs, configs, pid files, logs under log/, containerd's images); runtime sockets
# under /run/epo-cluster. etcd's data goes with down: each up is a fresh cluster.
#
# The pods live on the bridge epo-cni0 with the host at its gateway address, where the API
# server listens. Pods may open TCP connections to the local libvirt host's guest subnet
# (masqueraded behind the host's address there, so a guest sees the host), and reach the
# host-loopback ports in CLUSTER_HOST_PORTS at the gateway address (the libvirt host's
# sshd listens on 127.0.0.1 alone). There is no cluster DNS: clients use addresses.
#
# Knobs: CLUSTER_POD_CIDR (10.124.0.0/24, a /24; the host takes .1), CLUSTER_SERVICE_CIDR
# (10.125.0.0/24), CLUSTER_API_PORT (16443), CLUSTER_NODE (epo-node), CLUSTER_HOST_PORTS
# ("2222"), CLUSTER_GUEST_SUBNET (10.123.0.0/24, hack/libvirt-host.sh's), CLUSTER_TIMEOUT
# (seconds each wait may take, 300).
set -euo pipefail

HACK=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HACK/.." && pwd)
# shellcheck disable=SC2034 # read by lib/common.sh
LOG_TAG=cluster
# shellcheck source=lib/common.sh
source "$HACK/lib/common.sh"

CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/egress-proxies-operator
STATE=$CACHE/cluster
RUN=$STATE/run
LOGS=$STATE/log
PKI=$STATE/pki
RUNDIR=/run/epo-cluster
ENV_FILE=$STATE/env
CONTAINERD_SOCK=$RUNDIR/containerd.sock
POD_CIDR=${CLUSTER_POD_CIDR:-10.124.0.0/24}
GW=${POD_CIDR%.*}.1
SERVICE_CIDR=${CLUSTER_SERVICE_CIDR:-10.125.0.0/24}
SERVICE_IP=${SERVICE_CIDR%.*}.1
API_PORT=${CLUSTER_API_PORT:-16443}
NODE=${CLUSTER_NODE:-epo-node}
HOST_PORTS=${CLUSTER_HOST_PORTS:-2222}
GUEST_SUBNET=${CLUSTER_GUEST_SUBNET:-10.123.0.0/24}
TIMEOUT=${CLUSTER_TIMEOUT:-300}
CNI_BRIDGE=epo-cni0
CGROUP_ROOT=/epo-cluster
PAUSE_IMAGE=localhost/epo-pause:1
ETCD_PORT=12379
ETCD_PEER_PORT=12380
KCM_PORT=10257
SCHED_PORT=10259
KUBELET_PORT=10250
KUBELET_HEALTHZ_PORT=10248
PROXY_HEALTHZ_PORT=10256
PROXY_METRICS_PORT=10249
FWD=EPO-CLUSTER-FWD
NAT_OUT=EPO-CLUSTER-MASQ
NAT_IN=EPO-CLUSTER-HOSTPORTS
# In start order; down stops them in reverse.
COMPONENTS=(etcd kube-apiserver containerd kube-controller-manager kube-scheduler kubelet kube-proxy)
PACKAGES=(containerd runc containernetworking-plugins nftables conntrack iptables openssl curl)

# shellcheck source=lib/cluster-config.sh
source "$HACK/lib/cluster-config.sh"

lock() {
  mkdir -p "$STATE"
  exec 8>"$STATE/.lock"
  flock -w 600 8 || die "another cluster.sh holds $STATE/.lock"
}

kubectl() { "$ASSETS/kubectl" --kubeconfig "$STATE/admin.kubeconfig" "$@"; }
ctr_() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }

# The binary each component runs, by its comm name (15 characters at most).
comm_of() {
  case $1 in
  kube-controller-manager) echo kube-controller ;;
  *) echo "$1" ;;
  esac
}

running() { pid_alive "$RUN/$1.pid" "$(comm_of "$1")"; }

# start NAME WHAT CHECK... -- CMD...: start CMD as NAME unless it runs, then wait until
# CHECK succeeds, printing what it waited for and how long.
start() {
  local name=$1 what=$2
  shift 2
  local check=()
  while [[ $1 != -- ]]; do
    check+=("$1")
    shift
  done
  shift
  if running "$name"; then
    log "$name already running (pid $(<"$RUN/$name.pid"))"
  else
    spawn "$RUN/$name.pid" "$LOGS/$name.log" "$@"
    log "started $name (pid $(<"$RUN/$name.pid")), log $LOGS/$name.log; waiting for $what"
  fi
  local t0=$SECONDS
  if ! wait_until "$TIMEOUT" "$what" "${check[@]}"; then
    tail -n 25 "$LOGS/$name.log" >&2
    die "$name: $what did not happen within ${TIMEOUT}s (log $LOGS/$name.log)"
  fi
  log "$name: $what (after $((SECONDS - t0))s)"
}

stop() { # NAME [seconds before SIGKILL]
  local name=$1 grace=${2:-30} pid
  if running "$name"; then
    pid=$(<"$RUN/$name.pid")
    kill "$pid"
    if ! wait_until "$grace" "$name (pid $pid) to exit" bash -c "! kill -0 $pid"; then
      kill -9 "$pid" 2>/dev/null || true
      wait_until 10 "$name (pid $pid) to die" bash -c "! kill -0 $pid" || true
    fi
    log "stopped $name (pid $pid)"
  fi
  rm -f "$RUN/$name.pid"
}

https_ok() { curl -fsk --max-time 5 "$1" >/dev/null; }
api_ready() { kubectl get --raw /readyz >/dev/null; }
node_ready() {
  [[ $(kubectl get node "$NODE" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}') == True ]]
}
default_sa() { kubectl -n default get serviceaccount default && kubectl -n default get configmap kube-root-ca.crt; }
kubernetes_service() { curl -fs --max-time 5 --cacert "$PKI/ca.crt" "https://$SERVICE_IP/readyz" >/dev/null; }

# ------------------------------------------------------------------ network

sysctl_set() { # key value: set it, recording the value found first (restored by down)
  local key=$1 value=$2 file=/proc/sys/${1//.//}
  [[ -f $RUN/sysctl.$key ]] || cat "$file" >"$RUN/sysctl.$key"
  echo "$value" >"$file"
}

ensure_network() {
  if ! ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then
    ip link add "$CNI_BRIDGE" type bridge stp_state 0 forward_delay 0
    log "created bridge $CNI_BRIDGE"
  fi
  ip addr replace "$GW/${POD_CIDR#*/}" dev "$CNI_BRIDGE"
  ip link set "$CNI_BRIDGE" up
  sysctl_set net.ipv4.ip_forward 1
  # The host-loopback ports are DNATed to 127.0.0.1, which the kernel routes only with this.
  echo 1 >"/proc/sys/net/ipv4/conf/$CNI_BRIDGE/route_localnet"
  # Pods may open connections to the guests and get the answers; guests still open none.
  iptables -N "$FWD" 2>/dev/null || iptables -F "$FWD"
  iptables -A "$FWD" -s "$POD_CIDR" -d "$GUEST_SUBNET" -p tcp -j ACCEPT
  iptables -A "$FWD" -s "$GUEST_SUBNET" -d "$POD_CIDR" -m conntrack --ctstate ESTABLISHED,RELATED -j ACCEPT
  # First in FORWARD, above the libvirt host's guard (which drops all forwarding on its
  # bridge), even when that was hooked in after us.
  while iptables -D FORWARD -j "$FWD" 2>/dev/null; do :; done
  iptables -I FORWARD 1 -j "$FWD"
  iptables -t nat -N "$NAT_OUT" 2>/dev/null || iptables -t nat -F "$NAT_OUT"
  iptables -t nat -A "$NAT_OUT" -s "$POD_CIDR" -d "$GUEST_SUBNET" -j MASQUERADE
  iptables -t nat -C POSTROUTING -j "$NAT_OUT" 2>/dev/null || iptables -t nat -I POSTROUTING 1 -j "$NAT_OUT"
  iptables -t nat -N "$NAT_IN" 2>/dev/null || iptables -t nat -F "$NAT_IN"
  local port
  for port in $HOST_PORTS; do
    iptables -t nat -A "$NAT_IN" -i "$CNI_BRIDGE" -d "$GW" -p tcp --dport "$port" -j DNAT --to-destination "127.0.0.1:$port"
  done
  iptables -t nat -C PREROUTING -j "$NAT_IN" 2>/dev/null || iptables -t nat -I PREROUTING 1 -j "$NAT_IN"
  echo "$CNI_BRIDGE" >"$RUN/network"
}

# The nftables tables there were before the first up (iptables-nft makes nat and mangle on
# first use); down removes those made since, once empty.
record_tables() {
  [[ -f $RUN/nft-tables-before ]] || nft list tables >"$RUN/nft-tables-before"
}

# The kubelet's own iptables chains (KUBE-FIREWALL and the canaries it watches for a
# flush), for IPv4 and IPv6, then the tables left empty that were not there before.
remove_kubelet_chains() {
  local ipt t c
  for ipt in iptables ip6tables; do
    for c in INPUT OUTPUT; do
      while $ipt -D "$c" -j KUBE-FIREWALL 2>/dev/null; do :; done
    done
    for t in filter nat mangle; do
      for c in KUBE-FIREWALL KUBE-KUBELET-CANARY KUBE-IPTABLES-HINT; do
        $ipt -t "$t" -F "$c" 2>/dev/null && $ipt -t "$t" -X "$c" 2>/dev/null
      done
    done
  done
  [[ -f $RUN/nft-tables-before ]] || return 0
  local fam name
  while read -r _ fam name; do
    grep -qx "table $fam $name" "$RUN/nft-tables-before" && continue
    # only built-in chains with no rule in them: nothing of anyone's
    if ! nft list table "$fam" "$name" | grep -qvE '^\s*(table|chain|type|policy|\}|$)'; then
      nft delete table "$fam" "$name" && log "removed the empty nftables table $fam $name"
    fi
  done < <(nft list tables)
  rm -f "$RUN/nft-tables-before"
}

remove_network() {
  [[ -f $RUN/network ]] || return 0
  while iptables -D FORWARD -j "$FWD" 2>/dev/null; do :; done
  while iptables -t nat -D POSTROUTING -j "$NAT_OUT" 2>/dev/null; do :; done
  while iptables -t nat -D PREROUTING -j "$NAT_IN" 2>/dev/null; do :; done
  iptables -F "$FWD" 2>/dev/null && iptables -X "$FWD"
  iptables -t nat -F "$NAT_OUT" 2>/dev/null && iptables -t nat -X "$NAT_OUT"
  iptables -t nat -F "$NAT_IN" 2>/dev/null && iptables -t nat -X "$NAT_IN"
  ip link del "$CNI_BRIDGE" 2>/dev/null && log "deleted bridge $CNI_BRIDGE"
  local f
  for f in "$RUN"/sysctl.*; do
    [[ -f $f ]] || continue
    f=${f##*/sysctl.}
    cat "$RUN/sysctl.$f" >"/proc/sys/${f//.//}"
    rm -f "$RUN/sysctl.$f"
  done
  rm -f "$RUN/network"
  log "removed the pod network's bridge and rules"
}

# The kubelet writes pod logs under podLogsDir ($STATE/pod-logs) but its symlinks to them
# always into /var/log/containers; down removes ours, and the directory if up made it.
record_log_dirs() {
  [[ -d /var/log/containers || -f $RUN/made-var-log-containers ]] || {
    mkdir -p /var/log/containers
    touch "$RUN/made-var-log-containers"
  }
}

remove_log_links() {
  local l
  for l in /var/log/containers/*.log; do
    [[ -L $l && $(readlink "$l") == "$STATE/pod-logs/"* ]] && rm -f "$l"
  done
  if [[ -f $RUN/made-var-log-containers ]]; then
    rmdir /var/log/containers 2>/dev/null || log "warning: /var/log/containers is not empty; left in place"
    rm -f "$RUN/made-var-log-containers"
  fi
}

# ------------------------------------------------------------------ cgroups

# Under every v1 hierarchy (and the unified one), the kubelet's cgroup root, with cpuset's
# CPUs and memory nodes copied from the parent as v1 requires before a task may join.
ensure_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/; do
    mkdir -p "$h${CGROUP_ROOT#/}"
    if [[ -f ${h}cpuset.cpus ]]; then
      cat "${h}cpuset.cpus" >"$h${CGROUP_ROOT#/}/cpuset.cpus"
      cat "${h}cpuset.mems" >"$h${CGROUP_ROOT#/}/cpuset.mems"
    fi
  done
}

remove_cgroups() {
  local h d
  for h in /sys/fs/cgroup/*/; do
    [[ -d $h${CGROUP_ROOT#/} ]] || continue
    # depth first; a cgroup with a task left in it stays and is reported
    while read -r d; do
      rmdir "$d" 2>/dev/null || log "warning: cgroup $d not removed (tasks: $(wc -l <"$d/cgroup.procs" 2>/dev/null))"
    done < <(find "$h${CGROUP_ROOT#/}" -depth -type d)
  done
}

# ------------------------------------------------------------------ images

pause_image() {
  if ctr_ images check "name==$PAUSE_IMAGE" 2>/dev/null | grep -q complete; then return 0; fi
  mkdir -p "$STATE/images"
  (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags="-s -w" -o "$STATE/images/pause" ./hack/pause &&
    go run ./hack/imagebuild -bin "$STATE/images/pause" -path /pause -user 65535:65535 -ca "" \
      -tag "$PAUSE_IMAGE" -o "$STATE/images/pause.tar")
  ctr_ images import "$STATE/images/pause.tar" >/dev/null
  log "imported the sandbox image $PAUSE_IMAGE (built from hack/pause)"
}

cmd_import() {
  (($# > 0)) || die "import: name at least one image tarball"
  running containerd || die "containerd is not running; run: $0 up"
  local f
  for f in "$@"; do
    ctr_ images import "$f" >/dev/null || die "importing $f into containerd failed"
    log "imported $f: $(tar -xOf "$f" manifest.json 2>/dev/null | jq -r '.[].RepoTags[]?' 2>/dev/null | tr '\n' ' ')"
  done
}

# ------------------------------------------------------------------ up

write_env() {
  cat >"$ENV_FILE" <<EOF
# Written by hack/cluster.sh up; source it to use the cluster.
export KUBECONFIG=$STATE/admin.kubeconfig
export CLUSTER_KUBECTL=$ASSETS/kubectl
export CLUSTER_CTR="ctr --address $CONTAINERD_SOCK -n k8s.io"
export CLUSTER_CONTAINERD_SOCK=$CONTAINERD_SOCK
export CLUSTER_NODE=$NODE
export CLUSTER_GATEWAY=$GW
export CLUSTER_POD_CIDR=$POD_CIDR
export CLUSTER_SERVICE_CIDR=$SERVICE_CIDR
export CLUSTER_HOST_PORTS="$HOST_PORTS"
export CLUSTER_LOGS=$LOGS
EOF
}

cmd_up() {
  lock
  mkdir -p "$RUN" "$LOGS" "$RUNDIR"
  ensure_packages "${PACKAGES[@]}"
  log "Kubernetes binaries (a first build takes about 25 minutes of CPU; cached after)"
  ASSETS=$("$HACK/envtest-assets.sh" kube-apiserver etcd kubectl kube-controller-manager kube-scheduler kubelet kube-proxy)
  ensure_pki
  local n
  for n in admin kube-controller-manager kube-scheduler kube-proxy kubelet; do kubeconfig "$n"; done
  write_cni_config
  write_containerd_config
  write_kubelet_config
  write_kube_proxy_config
  record_tables
  record_log_dirs
  ensure_network
  ensure_cgroups

  start etcd "etcd's /health on 127.0.0.1:$ETCD_PORT" curl -fs --max-time 5 "http://127.0.0.1:$ETCD_PORT/health" -- \
    "$ASSETS/etcd" --name epo-node --data-dir "$STATE/etcd" --unsafe-no-fsync \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "epo-node=http://127.0.0.1:$ETCD_PEER_PORT"
  start kube-apiserver "the API server's /readyz on $GW:$API_PORT" api_ready -- \
    "$ASSETS/kube-apiserver" --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
    --bind-address "$GW" --advertise-address "$GW" --secure-port "$API_PORT" --cert-dir "$STATE/apiserver" \
    --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" --client-ca-file "$PKI/ca.crt" \
    --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction --anonymous-auth=true \
    --service-account-issuer https://kubernetes.default.svc.cluster.local \
    --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --allow-privileged=false --profiling=false \
    --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
    --kubelet-certificate-authority "$PKI/ca.crt" --kubelet-preferred-address-types InternalIP
  start containerd "containerd answering on $CONTAINERD_SOCK" ctr --address "$CONTAINERD_SOCK" version -- \
    containerd --config "$STATE/containerd.toml"
  pause_image
  start kube-controller-manager "its /healthz on 127.0.0.1:$KCM_PORT" https_ok "https://127.0.0.1:$KCM_PORT/healthz" -- \
    "$ASSETS/kube-controller-manager" --kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
    --authentication-kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
    --authorization-kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$KCM_PORT" --leader-elect=false --use-service-account-credentials \
    --service-account-private-key-file "$PKI/sa.key" --root-ca-file "$PKI/ca.crt" \
    --cluster-signing-cert-file "$PKI/ca.crt" --cluster-signing-key-file "$PKI/ca.key" \
    --service-cluster-ip-range "$SERVICE_CIDR" --allocate-node-cidrs=false --profiling=false
  start kube-scheduler "its /healthz on 127.0.0.1:$SCHED_PORT" https_ok "https://127.0.0.1:$SCHED_PORT/healthz" -- \
    "$ASSETS/kube-scheduler" --kubeconfig "$STATE/kube-scheduler.kubeconfig" \
    --authentication-kubeconfig "$STATE/kube-scheduler.kubeconfig" \
    --authorization-kubeconfig "$STATE/kube-scheduler.kubeconfig" \
    --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" --leader-elect=false --profiling=false
  start kubelet "node $NODE Ready" node_ready -- \
    "$ASSETS/kubelet" --config "$STATE/kubelet.yaml" --kubeconfig "$STATE/kubelet.kubeconfig" \
    --hostname-override "$NODE" --node-ip "$GW" --root-dir "$STATE/kubelet" --v 1
  start kube-proxy "the kubernetes Service at https://$SERVICE_IP" kubernetes_service -- \
    "$ASSETS/kube-proxy" --config "$STATE/kube-proxy.yaml"
  if ! wait_until "$TIMEOUT" "the default ServiceAccount and kube-root-ca.crt" default_sa; then
    die "the controller manager made no default ServiceAccount (log $LOGS/kube-controller-manager.log)"
  fi
  write_env
  log "up; source $ENV_FILE (kubectl: $ASSETS/kubectl)"
}

# ------------------------------------------------------------------ down

# Our containerd's shims: containerd-shim-runc-v2 processes started with our socket.
our_shims() {
  local p
  for p in /proc/[0-9]*; do
    [[ $(cat "$p/comm" 2>/dev/null) == containerd-shim* ]] || continue
    tr '\0' ' ' <"$p/cmdline" 2>/dev/null | grep -q -- "-address $CONTAINERD_SOCK " && echo "${p#/proc/}"
  done
  return 0
}

no_tasks() { [[ -z $(ctr_ tasks ls -q 2>/dev/null) ]]; }

# Every pod goes while the kubelet still runs, so it stops the sandboxes itself (the CNI
# plugin releases the address and removes the veth). The controllers stop first: nothing
# is recreated.
delete_pods() {
  if ! running kube-apiserver || ! running kubelet || ! api_ready 2>/dev/null; then
    return 0
  fi
  stop kube-controller-manager
  stop kube-scheduler
  log "deleting every pod; the kubelet stops their sandboxes"
  kubectl delete pods --all-namespaces --all --grace-period=1 --wait=false >/dev/null 2>&1 || true
  wait_until 120 "the kubelet to stop every container" no_tasks ||
    log "warning: containers left after 120s: $(ctr_ tasks ls -q | tr '\n' ' ')"
}

# What a dead kubelet left: tasks, containers and the sandboxes' network namespaces (found
# by the pod address on their eth0), then the shims.
remove_leftovers() {
  if running containerd; then
    local id
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks kill -s KILL "$id" 2>/dev/null || true; done
    wait_until 30 "killed tasks to exit" no_tasks || true
    for id in $(ctr_ tasks ls -q 2>/dev/null); do ctr_ tasks delete -f "$id" >/dev/null 2>&1 || true; done
    for id in $(ctr_ containers ls -q 2>/dev/null); do ctr_ containers delete "$id" >/dev/null 2>&1 || true; done
  fi
  local ns
  for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ { print $1 }'); do
    if ip -n "$ns" -4 -o addr show 2>/dev/null | awk '{ print $4 }' | grep -q "^${POD_CIDR%.*}\."; then
      ip netns delete "$ns" && log "removed network namespace $ns"
    fi
  done
}

unmount_ours() {
  local m
  while read -r m; do
    umount "$m" 2>/dev/null || umount -l "$m" || log "warning: could not unmount $m"
  done < <(findmnt -rn -o TARGET | grep -E "^($STATE|$RUNDIR)(/|$)" | sort -r)
}

cmd_down() {
  lock
  [[ -d $RUN ]] || { log "nothing to stop ($RUN absent)"; return 0; }
  ASSETS=$("$HACK/envtest-assets.sh" kubectl)
  delete_pods
  stop kube-controller-manager
  stop kube-scheduler
  stop kubelet
  if running kube-proxy; then
    stop kube-proxy
  fi
  # kube-proxy's own tables; --cleanup removes them even when it died without doing so
  if nft list table ip kube-proxy >/dev/null 2>&1 || nft list table ip6 kube-proxy >/dev/null 2>&1; then
    "$("$HACK/envtest-assets.sh" kube-proxy)/kube-proxy" --cleanup --config "$STATE/kube-proxy.yaml" >>"$LOGS/kube-proxy.log" 2>&1 || true
    nft delete table ip kube-proxy 2>/dev/null || true
    nft delete table ip6 kube-proxy 2>/dev/null || true
    log "removed kube-proxy's nftables tables"
  fi
  remove_leftovers
  stop containerd
  local pid
  for pid in $(our_shims); do
    kill -9 "$pid" 2>/dev/null && log "killed shim $pid"
  done
  stop kube-apiserver
  stop etcd
  unmount_ours
  remove_network
  remove_kubelet_chains
  remove_cgroups
  remove_log_links
  rm -rf "$STATE/etcd" "$STATE/kubelet" "$STATE/pod-logs" "$STATE/cni/ipam" "$RUNDIR" "$ENV_FILE"
  log "down (certificates, binaries and containerd's images stay for the next up)"
}

cmd_status() {
  local ok=0 n
  for n in "${COMPONENTS[@]}"; do
    if running "$n"; then echo "$n: running (pid $(<"$RUN/$n.pid"))"; else
      echo "$n: stopped"
      ok=1
    fi
  done
  if ip link show "$CNI_BRIDGE" >/dev/null 2>&1; then echo "bridge $CNI_BRIDGE: $GW"; else
    echo "bridge $CNI_BRIDGE: absent"
    ok=1
  fi
  if [[ -s $STATE/admin.kubeconfig ]] && running kube-apiserver; then
    ASSETS=$("$HACK/envtest-assets.sh" kubectl)
    if node_ready 2>/dev/null; then echo "node $NODE: Ready"; else
      echo "node $NODE: not Ready"
      ok=1
    fi
  fi
  return $ok
}

case ${1:-} in
up) cmd_up ;;
down) cmd_down ;;
status) cmd_status ;;
env) cat "$ENV_FILE" 2>/dev/null || die "no env file at $ENV_FILE; run: $0 up" ;;
import)
  shift
  cmd_import "$@"
  ;;
*)
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
  ;;
esac
