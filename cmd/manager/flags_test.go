package main

import (
	"io"
	"strings"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/util/intstr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/remediation"
)

func TestFlagDefaults(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		flag     string
		got, def any
	}{
		{"max-concurrent-reconciles", o.maxConcurrentReconciles, 3},
		{"quota-retry", o.quotaRetry, 5 * time.Minute},
		{"pending-retry", o.pendingRetry, 10 * time.Second},
		{"boot-poll-interval", o.health.BootPollInterval, time.Second},
		{"address-hold", o.addressHold, 15 * time.Second},
		{"deletion-drain", o.deletionDrain, 10 * time.Second},
		{"failed-recheck-interval", o.failedRecheck, 10 * time.Minute},
		{"proxy-status-heartbeat", o.health.StatusHeartbeat, 10 * time.Minute},
		{"provider-check-interval", o.health.ProviderCheckInterval, time.Minute},
		{"provider-check-timeout", o.health.ProviderCheckTimeout, 15 * time.Second},
		{"proxy-check-interval", o.health.ProxyCheckInterval, 30 * time.Second},
		{"gc-interval", o.health.GCInterval, 10 * time.Minute},
		{"gc-grace", o.health.GCGrace, 10 * time.Minute},
		{"discovery-bind-address", o.health.DiscoveryBindAddress, ":8082"},
		{"discovery-drain-delay", o.health.DiscoveryDrainDelay, 5 * time.Second},
		{"discovery-kubernetes-auth", o.health.DiscoveryKubeAuth, true},
		{"ban-cooldown", o.health.BanCooldown, 5 * time.Minute},
		{"ban-max-cooldown", o.health.BanMaxCooldown, 24 * time.Hour},
		{"ban-max-cooling-percent", o.health.BanMaxCoolingPercent, 50},
		{"ban-retire-after-sites", o.health.BanRetireAfterSites, 5},
		{"ban-retire-window", o.health.BanRetireWindow, time.Hour},
		{"unreachable-report-holdoff", o.health.UnreachableHoldoff, time.Minute},
		{"probe-target-direct-check", o.health.ProbeTargetCheck, true},
		{"ban-max-retirements-per-hour", o.health.BanMaxRetirementsPerHour, intstr.FromString("10%")},
		{"remediation-boot-timeout", o.remediation.BootTimeout, 10 * time.Minute},
		{"remediation-unhealthy-timeout", o.remediation.UnhealthyTimeout, 5 * time.Minute},
		{"max-unhealthy", o.remediation.MaxUnhealthy, intstr.FromString("40%")},
		{"leader-elect", o.leaderElect, false},
		{"autoscaler", o.autoscaler, true},
		{"metrics-bind-address", o.metricsAddr, ":8443"},
		{"metrics-secure", o.metricsSecure, true}, // HTTPS behind TokenReview and SubjectAccessReview
		{"metrics-cert-dir", o.metricsCertDir, ""},
		{"enable-http2", o.enableHTTP2, false},
		{"install-id", o.installID, ""}, // empty: the UID of kube-system, read at start
	} {
		if c.got != c.def {
			t.Errorf("--%s defaults to %v, want %v", c.flag, c.got, c.def)
		}
	}
	if o.health.ProxyProbeURL == "" || o.providersConfig == "" || o.metricsAddr == "" || o.probeAddr == "" {
		t.Errorf("empty defaults: %+v", o)
	}
}

func TestFlagErrors(t *testing.T) {
	var out strings.Builder
	if _, err := parseFlags([]string{"--max-concurrent-reconciles=0"}, &out); err == nil || !strings.Contains(err.Error(), "at least 1") {
		t.Errorf("--max-concurrent-reconciles=0: %v", err)
	}
	if _, err := parseFlags([]string{"--quota-retry=soon"}, &out); err == nil || !strings.Contains(out.String(), "quota-retry") {
		t.Errorf("--quota-retry=soon: %v, output %q", err, out.String())
	}
	for _, bad := range []string{"Staging", "two words", "-lead", strings.Repeat("a", 64), "ünï"} {
		_, err := parseFlags([]string{"--install-id", bad}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--install-id") {
			t.Errorf("--install-id %q: %v, want an error naming the flag", bad, err)
		}
	}
	if o, err := parseFlags([]string{"--install-id", "homelab-staging_2"}, io.Discard); err != nil || o.installID != "homelab-staging_2" {
		t.Errorf("--install-id homelab-staging_2: %v, %+v", err, o)
	}
	for _, bad := range [][]string{{"--ban-retire-after-sites=-1"}, {"--ban-retire-after-sites=101"}, {"--ban-retire-window=0s"}, {"--ban-retire-window=-1m"}, {"--deletion-drain=-1s"},
		{"--ban-max-retirements-per-hour=-1"}, {"--ban-max-retirements-per-hour=ten"}, {"--ban-max-retirements-per-hour=1001"},
		{"--unreachable-report-holdoff=0s"},
		{"--remediation-boot-timeout=30s"}, {"--remediation-boot-timeout=25h"}, {"--remediation-unhealthy-timeout=0s"}, {"--remediation-unhealthy-timeout=-5m"},
		{"--max-unhealthy=-1"}, {"--max-unhealthy=101%"}, {"--max-unhealthy=half"}, {"--demand-namespace=Not_A_Namespace"}} {
		flag := strings.SplitN(strings.TrimPrefix(bad[0], "--"), "=", 2)[0]
		if _, err := parseFlags(bad, io.Discard); err == nil || !strings.Contains(err.Error(), "--"+flag) {
			t.Errorf("%s: %v, want an error naming --%s", bad[0], err, flag)
		}
	}
	o, err := parseFlags([]string{"--zap-log-level=debug", "--quota-retry=90s"}, io.Discard)
	if err != nil || o.quotaRetry != 90*time.Second {
		t.Errorf("parsing zap and duration flags: %v, %+v", err, o)
	}
}

// --demand-namespace defaults to the pod's own namespace (POD_NAMESPACE here), and a given
// one is taken as it is.
func TestDemandNamespaceFlag(t *testing.T) {
	t.Setenv("POD_NAMESPACE", "egress-system")
	o, err := parseFlags(nil, io.Discard)
	if err != nil || o.health.DemandNamespace != "egress-system" || o.demandNamespaceFrom != "POD_NAMESPACE" {
		t.Fatalf("default: %v, %q from %q; want egress-system from POD_NAMESPACE", err, o.health.DemandNamespace, o.demandNamespaceFrom)
	}
	o, err = parseFlags([]string{"--demand-namespace", "operators"}, io.Discard)
	if err != nil || o.health.DemandNamespace != "operators" {
		t.Fatalf("--demand-namespace operators: %v, %q", err, o.health.DemandNamespace)
	}
}

// The ban flags make the policy of standalone Proxies and of pools' unset spec.bans
// fields, the feedback recorder's and the ban controller's alike.
func TestBanFlagsMakeThePolicy(t *testing.T) {
	o, err := parseFlags([]string{"--ban-cooldown=1m", "--ban-max-cooldown=2h", "--ban-retire-after-sites=0", "--ban-retire-window=30m"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := bans.Policy{Cooldown: time.Minute, MaxCooldown: 2 * time.Hour, RetireAfterSites: 0, RetireWindow: 30 * time.Minute}
	if got := banPolicy(o.health); got != want {
		t.Errorf("banPolicy = %+v, want %+v", got, want)
	}
}

// The remediation flags make the policy the reconcilers are given; the defaults are the
// planner's.
func TestRemediationFlagsMakeThePolicy(t *testing.T) {
	o, err := parseFlags([]string{"--remediation-boot-timeout=20m", "--remediation-unhealthy-timeout=2m", "--max-unhealthy=3"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	want := remediation.DefaultPolicy()
	want.BootTimeout, want.UnhealthyTimeout, want.MaxUnhealthy = 20*time.Minute, 2*time.Minute, intstr.FromInt(3)
	if o.remediation != want {
		t.Errorf("policy = %+v, want %+v", o.remediation, want)
	}
	d, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if d.remediation != remediation.DefaultPolicy() {
		t.Errorf("default policy = %+v, want the planner's %+v", d.remediation, remediation.DefaultPolicy())
	}
}
