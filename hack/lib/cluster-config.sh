# shellcheck shell=bash disable=SC2153 # STATE, PKI, GW... are set by hack/cluster.sh
# The one-node cluster's certificates, kubeconfigs and component configs (sourced by
# hack/cluster.sh; the variables come from there). Every file is written once and kept
# across down and up, except where the address or a knob it names changes.

# cert NAME CN O EXT: a key and a certificate signed by the cluster CA. EXT is the
# extension lines (usage, SANs). An existing pair is kept.
cert() {
  local name=$1 cn=$2 o=$3 ext=$4
  [[ -s $PKI/$name.crt && -s $PKI/$name.key ]] && return 0
  local subj="/CN=$cn"
  [[ -n $o ]] && subj="/O=$o$subj"
  openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/$name.key" 2>/dev/null
  openssl req -new -key "$PKI/$name.key" -subj "$subj" -out "$PKI/$name.csr" 2>/dev/null
  printf '%b\n' "$ext" >"$PKI/$name.ext"
  openssl x509 -req -in "$PKI/$name.csr" -CA "$PKI/ca.crt" -CAkey "$PKI/ca.key" -CAcreateserial \
    -days 3650 -extfile "$PKI/$name.ext" -out "$PKI/$name.crt" 2>/dev/null
  rm -f "$PKI/$name.csr" "$PKI/$name.ext"
  chmod 0600 "$PKI/$name.key"
}

# ensure_pki: the CA, the service-account signing key pair, a serving certificate for the
# API server and the kubelet, and a client certificate per identity. The serving
# certificates are remade when the gateway address they name changes.
ensure_pki() {
  mkdir -p "$PKI"
  if [[ ! -s $PKI/ca.crt ]]; then
    openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$PKI/ca.key" 2>/dev/null
    openssl req -x509 -new -key "$PKI/ca.key" -subj "/CN=epo-cluster-ca" -days 3650 -out "$PKI/ca.crt" 2>/dev/null
    chmod 0600 "$PKI/ca.key"
    log "made the cluster CA in $PKI"
  fi
  if [[ ! -s $PKI/sa.key ]]; then
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$PKI/sa.key" 2>/dev/null
    openssl pkey -in "$PKI/sa.key" -pubout -out "$PKI/sa.pub" 2>/dev/null
    chmod 0600 "$PKI/sa.key"
  fi
  if [[ "$(cat "$PKI/serving.for" 2>/dev/null)" != "$GW $SERVICE_IP $NODE" ]]; then
    rm -f "$PKI"/apiserver.* "$PKI"/kubelet-serving.*
    echo "$GW $SERVICE_IP $NODE" >"$PKI/serving.for"
  fi
  local server="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth"
  local client="basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth"
  cert apiserver kube-apiserver "" "$server\nsubjectAltName=IP:$GW,IP:$SERVICE_IP,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  cert kubelet-serving "system:node:$NODE" system:nodes "$server\nsubjectAltName=IP:$GW,DNS:$NODE"
  cert admin admin system:masters "$client"
  cert apiserver-kubelet-client kube-apiserver-kubelet-client system:masters "$client"
  cert kube-controller-manager system:kube-controller-manager "" "$client"
  cert kube-scheduler system:kube-scheduler "" "$client"
  cert kube-proxy system:kube-proxy "" "$client"
  cert kubelet "system:node:$NODE" system:nodes "$client"
}

# put FILE COMPONENT: writes stdin to FILE only when it differs from what FILE holds, and
# then stops COMPONENT if it runs, so that up starts it again on the new file. A file
# rewritten unchanged would stop kube-proxy all the same: it exits whenever its config
# file is written to.
put() {
  local file=$1 component=${2:-} tmp
  tmp=$(mktemp "$file.XXXXXX")
  cat >"$tmp"
  if cmp -s "$tmp" "$file"; then
    rm -f "$tmp"
    return 0
  fi
  mv -f "$tmp" "$file"
  if [[ -n $component ]] && running "$component"; then
    log "$file changed; restarting $component"
    stop "$component"
  fi
}

# kubeconfig NAME: $STATE/NAME.kubeconfig, the API server as a client certificate NAME.
kubeconfig() {
  put "$STATE/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: epo-cluster
    cluster:
      server: https://$GW:$API_PORT
      certificate-authority: $PKI/ca.crt
users:
  - name: $1
    user:
      client-certificate: $PKI/$1.crt
      client-key: $PKI/$1.key
contexts:
  - name: epo-cluster
    context: {cluster: epo-cluster, user: $1}
current-context: epo-cluster
EOF
}

# The static CNI config containerd reads: the pods on a bridge of their own with the
# host as their gateway, addresses from host-local with its state in $STATE. No masquerade
# by the plugin: the only rule the pods' traffic needs is cluster.sh's own.
write_cni_config() {
  mkdir -p "$STATE/cni/net.d"
  put "$STATE/cni/net.d/10-epo-cluster.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "epo-cluster",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$CNI_BRIDGE",
      "isGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {
        "type": "host-local",
        "ranges": [[{"subnet": "$POD_CIDR", "gateway": "$GW"}]],
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": "$STATE/cni/ipam"
      }
    },
    {"type": "loopback"}
  ]
}
EOF
}

# containerd with paths of its own. restrict_oom_score_adj: this machine has no
# CAP_SYS_RESOURCE, so runc cannot set the negative oom_score_adj the kubelet asks for and
# fails every sandbox without it. The sandbox image is built here (no registry is reachable).
write_containerd_config() {
  put "$STATE/containerd.toml" containerd <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUNDIR/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.internal.v1.tracing", "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "$CONTAINERD_SOCK"

[ttrpc]
  address = "$CONTAINERD_SOCK.ttrpc"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$PAUSE_IMAGE"
  restrict_oom_score_adj = true
  enable_selinux = false
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = ""
EOF
}

# The kubelet. failCgroupV1: false: this machine has cgroup v1, which the kubelet refuses
# by default; cgroupfs needs no systemd. Every pod cgroup goes under $CGROUP_ROOT, so down
# removes exactly those. Image GC is off: the images it would collect were imported here
# and cannot be pulled again.
write_kubelet_config() {
  mkdir -p "$STATE/kubelet"
  put "$STATE/kubelet.yaml" kubelet <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: $CGROUP_ROOT
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: $GW
port: $KUBELET_PORT
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $KUBELET_HEALTHZ_PORT
tlsCertFile: $PKI/kubelet-serving.crt
tlsPrivateKeyFile: $PKI/kubelet-serving.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization:
  mode: Webhook
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
podLogsDir: $STATE/pod-logs
failSwapOn: false
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard:
  memory.available: 100Mi
  nodefs.available: 1%
  imagefs.available: 1%
  nodefs.inodesFree: 1%
serializeImagePulls: false
registerNode: true
EOF
}

# kube-proxy in nftables mode: its rules live in tables of its own (ip and ip6
# kube-proxy), apart from the iptables rules of the libvirt host sharing this machine, and
# go with them. conntrack limits are left as they are (maxPerCore 0).
write_kube_proxy_config() {
  put "$STATE/kube-proxy.yaml" kube-proxy <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: nftables
clientConnection:
  kubeconfig: $STATE/kube-proxy.kubeconfig
hostnameOverride: $NODE
clusterCIDR: $POD_CIDR
bindAddress: $GW
healthzBindAddress: 127.0.0.1:$PROXY_HEALTHZ_PORT
metricsBindAddress: 127.0.0.1:$PROXY_METRICS_PORT
nodePortAddresses: ["$GW/32"]
conntrack:
  maxPerCore: 0
  min: 0
  tcpEstablishedTimeout: 0s
  tcpCloseWaitTimeout: 0s
EOF
}
