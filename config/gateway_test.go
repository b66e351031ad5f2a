package config_test

import (
	"bytes"
	"fmt"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/labels"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/gateway/kube"
)

// gatewayGrants is what internal/gateway/kube does with the API server, and all the
// gateway's ClusterRole (or, with watchNamespaces, the ClusterRole and the watched
// namespaces' Roles) may give: its cache reads Proxies, ProxyPools and Secrets, the ban
// recorder gets a Proxy past the cache and applies its status, the credentials look-up
// gets a Secret's metadata past the cache, and token checks create TokenReviews and
// SubjectAccessReviews. Nothing on Leases: see gatewayDemandGrants.
var gatewayGrants = []string{
	"create authentication.k8s.io/tokenreviews",
	"create authorization.k8s.io/subjectaccessreviews",
	"get /secrets", "list /secrets", "watch /secrets",
	"get egress.hrajfrisbee.cz/proxies", "list egress.hrajfrisbee.cz/proxies", "watch egress.hrajfrisbee.cz/proxies",
	"get egress.hrajfrisbee.cz/proxypools", "list egress.hrajfrisbee.cz/proxypools", "watch egress.hrajfrisbee.cz/proxypools",
	"patch egress.hrajfrisbee.cz/proxies/status",
}

// gatewayDemandGrants is the gateway's Role in its own namespace (the demand namespace):
// its demand per pool, applied to coordination.k8s.io Leases there, and nothing else.
var gatewayDemandGrants = []string{
	"create coordination.k8s.io/leases", "get coordination.k8s.io/leases", "list coordination.k8s.io/leases",
	"watch coordination.k8s.io/leases", "update coordination.k8s.io/leases", "patch coordination.k8s.io/leases",
}

// checkDemandRole: the gateway's demand Role grants gatewayDemandGrants, none more.
func checkDemandRole(t *testing.T, what string, got map[grant]bool) {
	t.Helper()
	want := slices.Clone(gatewayDemandGrants)
	slices.Sort(want)
	if g := sortedGrants(got); !slices.Equal(g, want) {
		t.Errorf("%s grants\n%s\nwant\n%s", what, strings.Join(g, "\n"), strings.Join(want, "\n"))
	}
}

// readVerbs are the verbs that change nothing.
var readVerbs = []string{"get", "list", "watch"}

// checkGatewayGrants: the grants are gatewayGrants, none more: Secrets only read, and the
// only writes the status patch and the two reviews; nothing at all on Leases (the demand
// Leases are written through the Role in the gateway's own namespace).
func checkGatewayGrants(t *testing.T, what string, got map[grant]bool) {
	t.Helper()
	for g := range got {
		switch {
		case g.resource == "secrets" && !slices.Contains(readVerbs, g.verb):
			t.Errorf("%s grants %s: the gateway only reads Secrets", what, g)
		case g.group == "coordination.k8s.io" && g.resource == "leases" || g.resource == "leases":
			t.Errorf("%s grants %s: the demand Leases are written through the Role in the gateway's own namespace alone", what, g)
		case !slices.Contains(readVerbs, g.verb) && g.String() != "patch egress.hrajfrisbee.cz/proxies/status" && g.verb != "create":
			t.Errorf("%s grants the write %s", what, g)
		case g.verb == "create" && g.resource != "tokenreviews" && g.resource != "subjectaccessreviews":
			t.Errorf("%s grants %s: the gateway creates only TokenReviews and SubjectAccessReviews (and Leases, through its Role)", what, g)
		case g.resource == "*" || g.group == "*" || g.verb == "*":
			t.Errorf("%s grants the wildcard %s", what, g)
		}
	}
	want := slices.Clone(gatewayGrants)
	slices.Sort(want)
	if g := sortedGrants(got); !slices.Equal(g, want) {
		t.Errorf("%s grants\n%s\nwant\n%s", what, strings.Join(g, "\n"), strings.Join(want, "\n"))
	}
}

// config/gateway's ClusterRole gives the gateway exactly what it does, and no Lease
// access; its one Role, in its own namespace, the demand Leases; both bound to the
// ServiceAccount its Deployment runs as. RBAC cannot restrict a grant by label, so it may
// get, list and watch every Secret; what keeps other Secrets' data out of the gateway is
// its cache, which lists and watches only the Secrets labelled as proxy credentials
// (kube.CacheByObject, which cmd/gateway gives its cache): that selector is checked here
// too, so neither side changes unseen.
func TestGatewayRBAC(t *testing.T) {
	var role rbacv1.ClusterRole
	var binding rbacv1.ClusterRoleBinding
	var sa corev1.ServiceAccount
	var roles []rbacv1.Role
	var roleBindings []rbacv1.RoleBinding
	for _, f := range kustomized(t, "gateway") {
		for _, doc := range documents(t, f) {
			var tm struct{ Kind string }
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatal(err)
			}
			switch tm.Kind {
			case "ClusterRole":
				decodeStrict(t, f, doc, &role)
			case "ClusterRoleBinding":
				decodeStrict(t, f, doc, &binding)
			case "ServiceAccount":
				decodeStrict(t, f, doc, &sa)
			case "Role":
				var r rbacv1.Role
				decodeStrict(t, f, doc, &r)
				roles = append(roles, r)
			case "RoleBinding":
				var rb rbacv1.RoleBinding
				decodeStrict(t, f, doc, &rb)
				roleBindings = append(roleBindings, rb)
			}
		}
	}
	checkGatewayGrants(t, "config/gateway's ClusterRole", grantsOf(role.Rules))
	if len(roles) != 1 || len(roleBindings) != 1 {
		t.Fatalf("config/gateway makes %d Roles and %d RoleBindings, want the demand Role and its binding", len(roles), len(roleBindings))
	}
	checkDemandRole(t, "config/gateway's Role "+roles[0].Name, grantsOf(roles[0].Rules))
	if roles[0].Namespace != sa.Namespace || roleBindings[0].Namespace != sa.Namespace {
		t.Errorf("the demand Role is in %q and its binding in %q, want the gateway's own namespace %q", roles[0].Namespace, roleBindings[0].Namespace, sa.Namespace)
	}
	saSubject := rbacv1.Subject{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}
	if rb := roleBindings[0]; rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != roles[0].Name || !slices.Equal(rb.Subjects, []rbacv1.Subject{saSubject}) {
		t.Errorf("%s binds %+v to %+v, want Role %s to %+v", rb.Name, rb.RoleRef, rb.Subjects, roles[0].Name, saSubject)
	}

	deps, _ := workloads(t)
	d := deps[gatewayDeployment]
	if d.Spec.Template.Spec.ServiceAccountName != sa.Name || sa.Name == "" {
		t.Errorf("the gateway runs as ServiceAccount %q, config/gateway makes %q", d.Spec.Template.Spec.ServiceAccountName, sa.Name)
	}
	want := rbacv1.Subject{Kind: "ServiceAccount", Name: sa.Name, Namespace: sa.Namespace}
	if binding.RoleRef.Kind != "ClusterRole" || binding.RoleRef.Name != role.Name || !slices.Equal(binding.Subjects, []rbacv1.Subject{want}) {
		t.Errorf("%s binds %+v to %+v, want ClusterRole %s to %+v", binding.Name, binding.RoleRef, binding.Subjects, role.Name, want)
	}
	if d.Spec.Template.Spec.ServiceAccountName == deps[managerDeployment].Spec.Template.Spec.ServiceAccountName {
		t.Error("the gateway runs as the manager's ServiceAccount")
	}
	// Both write their demand Leases in their own namespace by default.
	for _, name := range []string{gatewayDeployment, managerDeployment} {
		checkPodNamespaceEnv(t, "config's "+name, deps[name].Spec.Template.Spec.Containers[0].Env)
	}

	// The gateway's cache: Secrets only with the opt-in label.
	var secretSel labels.Selector
	for obj, by := range kube.CacheByObject() {
		if _, ok := obj.(*corev1.Secret); ok {
			secretSel = by.Label
		}
	}
	if secretSel == nil {
		t.Fatal("kube.CacheByObject() does not restrict the Secrets the gateway's cache lists")
	}
	if !secretSel.Matches(labels.Set{v1alpha1.CredentialsLabel: "true"}) {
		t.Errorf("the gateway's Secret selector %q does not take a Secret labelled %s=true", secretSel, v1alpha1.CredentialsLabel)
	}
	for _, other := range []labels.Set{{}, {v1alpha1.CredentialsLabel: "false"}, {"app": "x"}} {
		if secretSel.Matches(other) {
			t.Errorf("the gateway's Secret selector %q takes a Secret labelled %v", secretSel, other)
		}
	}
}

// chartObjects renders the chart with --set args and decodes it.
func chartObjects(t *testing.T, set ...string) map[string]map[string]any {
	t.Helper()
	var args []string
	for _, s := range set {
		args = append(args, "--set", s)
	}
	out, err := renderChart(t, args...)
	if err != nil {
		t.Fatal(err)
	}
	return objects(t, "helm template", out)
}

const gatewayName = releaseName + "-gateway"

// gatewayKeys are the objects the chart makes for the gateway by default.
var gatewayKeys = []string{
	"ServiceAccount " + releaseNS + "/" + gatewayName,
	"ClusterRole <nil>/" + gatewayName + "-role",
	"ClusterRoleBinding <nil>/" + gatewayName + "-rolebinding",
	"Role " + releaseNS + "/" + gatewayName + "-demand-role",
	"RoleBinding " + releaseNS + "/" + gatewayName + "-demand-rolebinding",
	"Deployment " + releaseNS + "/" + gatewayName,
	"Service " + releaseNS + "/" + gatewayName,
	"PodDisruptionBudget " + releaseNS + "/" + gatewayName,
}

func chartGateway(t *testing.T, got map[string]map[string]any) appsv1.Deployment {
	t.Helper()
	var d appsv1.Deployment
	o, ok := got["Deployment "+releaseNS+"/"+gatewayName]
	if !ok {
		t.Fatalf("no gateway Deployment among %v", slices.Sorted(func(yield func(string) bool) {
			for k := range got {
				if !yield(k) {
					return
				}
			}
		}))
	}
	decodeAs(t, o, &d)
	return d
}

// By default the chart makes the gateway: its Deployment of 2 replicas, Service,
// PodDisruptionBudget, ServiceAccount and ClusterRole with its binding, and no
// HorizontalPodAutoscaler; the ClusterRole gives what config/gateway's does.
func TestChartGatewayDefault(t *testing.T) {
	got := chartObjects(t)
	for _, k := range gatewayKeys {
		if _, ok := got[k]; !ok {
			t.Errorf("the default renders no %s", k)
		}
	}
	for k := range got {
		if strings.HasPrefix(k, "HorizontalPodAutoscaler ") {
			t.Errorf("the default renders %s", k)
		}
	}
	d := chartGateway(t, got)
	if d.Spec.Replicas == nil || *d.Spec.Replicas != 2 {
		t.Errorf("the gateway's replicas %v, want 2", d.Spec.Replicas)
	}
	var cr rbacv1.ClusterRole
	decodeAs(t, got["ClusterRole <nil>/"+gatewayName+"-role"], &cr)
	checkGatewayGrants(t, "the chart's gateway ClusterRole", grantsOf(cr.Rules))
	checkChartDemandRole(t, got)
	var mgr appsv1.Deployment
	decodeAs(t, got["Deployment "+releaseNS+"/"+releaseName+"-controller-manager"], &mgr)
	checkPodNamespaceEnv(t, "the chart's manager", mgr.Spec.Template.Spec.Containers[0].Env)
}

// checkChartDemandRole: the chart's gateway Role for the demand Leases, in the release
// namespace, bound to the gateway's ServiceAccount; and the gateway's pods know their
// namespace (POD_NAMESPACE, the default of --demand-namespace).
func checkChartDemandRole(t *testing.T, got map[string]map[string]any) {
	t.Helper()
	roleKey := "Role " + releaseNS + "/" + gatewayName + "-demand-role"
	bindingKey := "RoleBinding " + releaseNS + "/" + gatewayName + "-demand-rolebinding"
	if got[roleKey] == nil || got[bindingKey] == nil {
		t.Fatalf("want %s and %s", roleKey, bindingKey)
	}
	var role rbacv1.Role
	decodeAs(t, got[roleKey], &role)
	checkDemandRole(t, "the chart's "+roleKey, grantsOf(role.Rules))
	var rb rbacv1.RoleBinding
	decodeAs(t, got[bindingKey], &rb)
	sa := rbacv1.Subject{Kind: "ServiceAccount", Name: gatewayName, Namespace: releaseNS}
	if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || !slices.Equal(rb.Subjects, []rbacv1.Subject{sa}) {
		t.Errorf("%s binds %+v to %+v, want the Role %s to %+v", bindingKey, rb.RoleRef, rb.Subjects, role.Name, sa)
	}
	checkPodNamespaceEnv(t, "the chart's gateway", chartGateway(t, got).Spec.Template.Spec.Containers[0].Env)
}

// checkPodNamespaceEnv: POD_NAMESPACE comes from the pod's metadata.namespace.
func checkPodNamespaceEnv(t *testing.T, what string, env []corev1.EnvVar) {
	t.Helper()
	for _, e := range env {
		if e.Name == "POD_NAMESPACE" && e.ValueFrom != nil && e.ValueFrom.FieldRef != nil && e.ValueFrom.FieldRef.FieldPath == "metadata.namespace" {
			return
		}
	}
	t.Errorf("%s's container does not set POD_NAMESPACE from metadata.namespace (the demand namespace's default): env %+v", what, env)
}

// gateway.autoscaling.enabled renders an autoscaling/v2 HPA on CPU with the values given,
// aimed at the gateway's Deployment, which then carries no replicas (the HPA owns them).
func TestChartGatewayAutoscaling(t *testing.T) {
	got := chartObjects(t, "gateway.autoscaling.enabled=true", "gateway.autoscaling.minReplicas=3",
		"gateway.autoscaling.maxReplicas=12", "gateway.autoscaling.targetCPUUtilizationPercentage=65", "gateway.replicas=5")
	o, ok := got["HorizontalPodAutoscaler "+releaseNS+"/"+gatewayName]
	if !ok {
		t.Fatal("gateway.autoscaling.enabled=true renders no HorizontalPodAutoscaler")
	}
	var hpa autoscalingv2.HorizontalPodAutoscaler
	decodeAs(t, o, &hpa)
	if hpa.APIVersion != "autoscaling/v2" {
		t.Errorf("the HPA is %s, want autoscaling/v2", hpa.APIVersion)
	}
	if ref := hpa.Spec.ScaleTargetRef; ref.Kind != "Deployment" || ref.Name != gatewayName || ref.APIVersion != "apps/v1" {
		t.Errorf("the HPA scales %+v, want the Deployment %s", ref, gatewayName)
	}
	if hpa.Spec.MinReplicas == nil || *hpa.Spec.MinReplicas != 3 || hpa.Spec.MaxReplicas != 12 {
		t.Errorf("the HPA scales %v to %d, want 3 to 12", hpa.Spec.MinReplicas, hpa.Spec.MaxReplicas)
	}
	if m := hpa.Spec.Metrics; len(m) != 1 || m[0].Type != autoscalingv2.ResourceMetricSourceType || m[0].Resource == nil ||
		m[0].Resource.Name != corev1.ResourceCPU || m[0].Resource.Target.Type != autoscalingv2.UtilizationMetricType ||
		m[0].Resource.Target.AverageUtilization == nil || *m[0].Resource.Target.AverageUtilization != 65 {
		t.Errorf("the HPA's metrics %+v, want CPU utilization 65%%", m)
	}
	if d := chartGateway(t, got); d.Spec.Replicas != nil {
		t.Errorf("with autoscaling the gateway's Deployment still sets replicas %d", *d.Spec.Replicas)
	}
	// The CPU request is what utilization is measured against.
	d := chartGateway(t, got)
	if _, ok := d.Spec.Template.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU]; !ok {
		t.Error("the gateway requests no CPU: an HPA on CPU utilization has nothing to measure against")
	}
}

// gateway.enabled=false renders nothing of the gateway.
func TestChartGatewayDisabled(t *testing.T) {
	got := chartObjects(t, "gateway.enabled=false", "gateway.autoscaling.enabled=true", "watchNamespaces={team-a}", "installId=x")
	for k, o := range got {
		md := o["metadata"].(map[string]any)
		l, _ := md["labels"].(map[string]any)
		if strings.Contains(k, "gateway") || l["app.kubernetes.io/component"] == "gateway" {
			t.Errorf("gateway.enabled=false renders %s", k)
		}
	}
	if _, ok := got["Deployment "+releaseNS+"/"+releaseName+"-controller-manager"]; !ok {
		t.Error("gateway.enabled=false renders no manager either")
	}
}

// With watchNamespaces the gateway watches those namespaces alone and reads there through
// a Role in each; its ClusterRole keeps only the two reviews, and the Roles and the
// ClusterRole together give what the cluster-wide ClusterRole gives.
func TestChartGatewayWatchNamespaces(t *testing.T) {
	watched := []string{"team-a", "team-b"}
	got := chartObjects(t, "watchNamespaces={"+strings.Join(watched, ",")+"}", "installId=team-ab")
	var cr rbacv1.ClusterRole
	decodeAs(t, got["ClusterRole <nil>/"+gatewayName+"-role"], &cr)
	union := grantsOf(cr.Rules)
	for g := range union {
		if g.resource != "tokenreviews" && g.resource != "subjectaccessreviews" {
			t.Errorf("with watchNamespaces the gateway's ClusterRole grants %s", g)
		}
	}
	for _, ns := range watched {
		roleKey := fmt.Sprintf("Role %s/%s-role", ns, gatewayName)
		bindingKey := fmt.Sprintf("RoleBinding %s/%s-rolebinding", ns, gatewayName)
		if got[roleKey] == nil || got[bindingKey] == nil {
			t.Errorf("namespace %s: want %s and %s", ns, roleKey, bindingKey)
			continue
		}
		var role rbacv1.Role
		decodeAs(t, got[roleKey], &role)
		for g := range grantsOf(role.Rules) {
			union[g] = true
		}
		var rb rbacv1.RoleBinding
		decodeAs(t, got[bindingKey], &rb)
		sa := rbacv1.Subject{Kind: "ServiceAccount", Name: gatewayName, Namespace: releaseNS}
		if rb.RoleRef.Kind != "Role" || rb.RoleRef.Name != role.Name || !slices.Equal(rb.Subjects, []rbacv1.Subject{sa}) {
			t.Errorf("%s binds %+v to %+v, want the Role %s to %+v", bindingKey, rb.RoleRef, rb.Subjects, role.Name, sa)
		}
	}
	checkGatewayGrants(t, "the gateway's ClusterRole and Roles together", union)
	checkChartDemandRole(t, got)
	d := chartGateway(t, got)
	if !slices.Contains(d.Spec.Template.Spec.Containers[0].Args, "--watch-namespaces=team-a,team-b") {
		t.Errorf("the gateway's args %v lack --watch-namespaces=team-a,team-b", d.Spec.Template.Spec.Containers[0].Args)
	}
}

// Values reach the gateway: its ports (container, flags and Service together), the
// Service type, replicas, resources, extra args, the discovery token Secret and
// discovery.kubernetesAuth=false (the same password checks as discovery), the shutdown
// grace, and the PodDisruptionBudget switched off.
func TestChartValuesReachTheGateway(t *testing.T) {
	got := chartObjects(t, "gateway.ports.proxy=3128", "gateway.ports.socks=1081", "gateway.ports.metrics=9191",
		"gateway.service.type=LoadBalancer", "gateway.replicas=4", "gateway.resources.requests.cpu=250m",
		"gateway.extraArgs={--max-attempts=5}", "discovery.kubernetesAuth=false", "discovery.tokenSecretName=tok",
		"gateway.shutdownGraceSeconds=50", "gateway.terminationGracePeriodSeconds=90",
		"gateway.podDisruptionBudget.enabled=false", "image.tag=v9")
	if _, ok := got["PodDisruptionBudget "+releaseNS+"/"+gatewayName]; ok {
		t.Error("gateway.podDisruptionBudget.enabled=false still renders its PodDisruptionBudget")
	}
	d := chartGateway(t, got)
	js, _ := yaml.Marshal(d)
	for _, want := range []string{"--listen-address=:3128", "--socks-listen-address=:1081", "--metrics-bind-address=:9191",
		"--max-attempts=5", "--discovery-kubernetes-auth=false", "secretName: tok", "cpu: 250m", "replicas: 4",
		"--shutdown-grace=50s", "terminationGracePeriodSeconds: 90", "image: egress-proxies-operator:v9"} {
		if !bytes.Contains(js, []byte(want)) {
			t.Errorf("the gateway's Deployment lacks %q:\n%s", want, js)
		}
	}
	var svc corev1.Service
	decodeAs(t, got["Service "+releaseNS+"/"+gatewayName], &svc)
	if svc.Spec.Type != corev1.ServiceTypeLoadBalancer {
		t.Errorf("the gateway's Service is %s, want LoadBalancer", svc.Spec.Type)
	}
	checkServicePorts(t, "the gateway", svc, d.Spec.Template, gatewayPorts)
}

// A gateway the kubelet would kill mid-drain, or an autoscaler with its bounds crossed,
// fails the render naming both values (no schema can compare two values).
func TestChartRefusesCrossedGatewayValues(t *testing.T) {
	for _, tc := range []struct {
		set  []string
		want []string // in the error
	}{
		{[]string{"gateway.shutdownGraceSeconds=55"}, []string{"gateway.terminationGracePeriodSeconds (60)", "gateway.shutdownGraceSeconds (55)"}},
		{[]string{"gateway.autoscaling.enabled=true", "gateway.autoscaling.minReplicas=5", "gateway.autoscaling.maxReplicas=4"},
			[]string{"gateway.autoscaling.minReplicas (5)", "gateway.autoscaling.maxReplicas (4)"}},
	} {
		var args []string
		for _, s := range tc.set {
			args = append(args, "--set", s)
		}
		out, err := renderChart(t, args...)
		if err == nil {
			t.Errorf("helm template accepted %v:\n%.400s", tc.set, out)
			continue
		}
		for _, w := range tc.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%v: the error does not say %q:\n%v", tc.set, w, err)
			}
		}
	}
	// Just enough grace passes.
	if _, err := renderChart(t, "--set", "gateway.shutdownGraceSeconds=49"); err != nil {
		t.Error(err)
	}
}
