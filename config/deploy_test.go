package config_test

import (
	"bufio"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/yaml"
)

// kustomized returns every manifest file a kustomization reaches, following directory
// resources, in the order kustomize would read them.
func kustomized(t *testing.T, dir string) []string {
	t.Helper()
	var k struct {
		Resources []string `json:"resources"`
	}
	path := filepath.Join(dir, "kustomization.yaml")
	if err := yaml.Unmarshal(mustRead(t, path), &k); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	var files []string
	for _, r := range k.Resources {
		p := filepath.Join(dir, r)
		if fi, err := os.Stat(p); err == nil && fi.IsDir() {
			files = append(files, kustomized(t, p)...)
		} else {
			files = append(files, p)
		}
	}
	return files
}

// The Deployments config/default applies, by their name before the prefix.
const (
	managerDeployment = "controller-manager"
	gatewayDeployment = "gateway"
)

// deployed decodes the manager's Deployment and every Service that config/default applies.
func deployed(t *testing.T) (appsv1.Deployment, []corev1.Service) {
	t.Helper()
	deps, svcs := workloads(t)
	return deps[managerDeployment], svcs
}

// workloads decodes the Deployments (by name: the manager's and the gateway's, no other)
// and every Service that config/default applies.
func workloads(t *testing.T) (map[string]appsv1.Deployment, []corev1.Service) {
	t.Helper()
	var (
		deps = map[string]appsv1.Deployment{}
		svcs []corev1.Service
	)
	for _, f := range kustomized(t, "default") {
		for _, doc := range documents(t, f) {
			var tm struct{ Kind string }
			if err := yaml.Unmarshal(doc, &tm); err != nil {
				t.Fatalf("%s: %v", f, err)
			}
			switch tm.Kind {
			case "Deployment":
				var d appsv1.Deployment
				decodeStrict(t, f, doc, &d)
				deps[d.Name] = d
			case "Service":
				var s corev1.Service
				decodeStrict(t, f, doc, &s)
				svcs = append(svcs, s)
			}
		}
	}
	if _, ok := deps[managerDeployment]; !ok || len(deps) != 2 {
		t.Fatalf("config/default applies the Deployments %v, want %s and %s", slices.Sorted(maps.Keys(deps)), managerDeployment, gatewayDeployment)
	}
	if _, ok := deps[gatewayDeployment]; !ok {
		t.Fatalf("config/default applies the Deployments %v, want %s and %s", slices.Sorted(maps.Keys(deps)), managerDeployment, gatewayDeployment)
	}
	return deps, svcs
}

// selecting returns the Services whose selector matches the pod template's labels.
func selecting(svcs []corev1.Service, pod corev1.PodTemplateSpec) []corev1.Service {
	var out []corev1.Service
	for _, s := range svcs {
		if len(s.Spec.Selector) > 0 && labels.SelectorFromSet(s.Spec.Selector).Matches(labels.Set(pod.Labels)) {
			out = append(out, s)
		}
	}
	return out
}

// bindPort is the port of --<flag>=host:port in args.
// (The manager's and the gateway's flags both take host:port.)
func bindPort(t *testing.T, args []string, flag string) int32 {
	t.Helper()
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--"+flag+"="); ok {
			_, port, _ := strings.Cut(v, ":")
			n, err := strconv.Atoi(port)
			if err != nil {
				t.Fatalf("--%s=%s: %v", flag, v, err)
			}
			return int32(n)
		}
	}
	t.Fatalf("the args %v lack --%s", args, flag)
	return 0
}

// The Service that config/default applies reaches the manager's pods on the ports the
// manager listens on, so crawlers find the discovery API without a Service of their own.
func TestServiceReachesTheManager(t *testing.T) {
	d, svcs := deployed(t)
	mine := selecting(svcs, d.Spec.Template)
	if len(mine) != 1 {
		t.Fatalf("%d of config/default's Services select the manager's pods, want 1", len(mine))
	}
	checkServicePorts(t, "the manager", mine[0], d.Spec.Template, map[string]string{"discovery": "discovery-bind-address", "metrics": "metrics-bind-address"})
}

// The gateway's Service reaches the gateway's pods (and no manager's) on the ports the
// gateway listens on: the HTTP proxy, SOCKS5 and its metrics.
func TestServiceReachesTheGateway(t *testing.T) {
	deps, svcs := workloads(t)
	gw := deps[gatewayDeployment]
	mine := selecting(svcs, gw.Spec.Template)
	if len(mine) != 1 {
		t.Fatalf("%d of config/default's Services select the gateway's pods, want 1", len(mine))
	}
	if also := selecting(mine, deps[managerDeployment].Spec.Template); len(also) != 0 {
		t.Errorf("the gateway's Service %s selects the manager's pods too", mine[0].Name)
	}
	checkServicePorts(t, "the gateway", mine[0], gw.Spec.Template, gatewayPorts)
}

// gatewayPorts are the gateway's Service ports by name, and the flag that sets each.
var gatewayPorts = map[string]string{"proxy": "listen-address", "socks": "socks-listen-address", "metrics": "metrics-bind-address"}

// checkServicePorts: each named port of svc is the port of its flag in the pod's first
// container, and targets the container port of the same name.
func checkServicePorts(t *testing.T, who string, svc corev1.Service, pod corev1.PodTemplateSpec, flags map[string]string) {
	t.Helper()
	c := pod.Spec.Containers[0]
	containerPorts := map[string]int32{}
	for _, p := range c.Ports {
		containerPorts[p.Name] = p.ContainerPort
	}
	svcPorts := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = p
	}
	for name, flag := range flags {
		listen := bindPort(t, c.Args, flag)
		sp, ok := svcPorts[name]
		if !ok {
			t.Errorf("the Service %s has no %s port; %s listens on %d (--%s)", svc.Name, name, who, listen, flag)
			continue
		}
		if sp.Port != listen {
			t.Errorf("Service %s port %s is %d, %s's --%s port is %d", svc.Name, name, sp.Port, who, flag, listen)
		}
		target := sp.TargetPort
		if target.Type == intstr.String {
			target = intstr.FromInt32(containerPorts[target.StrVal])
		}
		if target.IntVal != listen || containerPorts[name] != listen {
			t.Errorf("Service %s port %s targets %s (container port %d), %s listens on %d", svc.Name, name, sp.TargetPort.String(), containerPorts[name], who, listen)
		}
	}
	if len(svc.Spec.Ports) != len(flags) {
		t.Errorf("the Service %s has %d ports, want %d (%v)", svc.Name, len(svc.Spec.Ports), len(flags), slices.Sorted(maps.Keys(flags)))
	}
}

// dockerfile returns the Dockerfile's instructions, one line each (no continuations).
func dockerfile(t *testing.T) []string {
	t.Helper()
	f, err := os.Open(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var lines []string
	cur := ""
	s := bufio.NewScanner(f)
	for s.Scan() {
		l := strings.TrimSpace(s.Text())
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		if strings.HasSuffix(l, "\\") {
			cur += strings.TrimSuffix(l, "\\") + " "
			continue
		}
		lines = append(lines, cur+l)
		cur = ""
	}
	return lines
}

// The image make docker-build produces is the one both Deployments run (the manager's and
// the gateway's), with each binary where its Deployment's command looks for it, the
// manager's as the entrypoint, and built from every directory either binary imports (a
// package outside the copied ones would fail only at docker build time).
func TestDockerfileBuildsWhatTheDeploymentRuns(t *testing.T) {
	deps, _ := workloads(t)
	lines := dockerfile(t)
	for _, name := range []string{managerDeployment, gatewayDeployment} {
		t.Run(name, func(t *testing.T) {
			checkImage(t, lines, deps[name], name == managerDeployment)
		})
	}
}

func checkImage(t *testing.T, lines []string, d appsv1.Deployment, entrypoint bool) {
	c := d.Spec.Template.Spec.Containers[0]

	var final []string // the last stage, the image itself
	for i, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			final = lines[i:]
		}
	}
	if !slices.Contains(final, "COPY --from=builder "+c.Command[0]+" "+c.Command[0]) {
		t.Errorf("the final stage %q does not copy the binary to %s, the Deployment's command", final, c.Command[0])
	}
	if entrypoint && !slices.Contains(final, `ENTRYPOINT ["`+c.Command[0]+`"]`) {
		t.Errorf("the final stage %q does not run %s", final, c.Command[0])
	}
	if sc := d.Spec.Template.Spec.SecurityContext; !slices.Contains(final, "USER "+strconv.FormatInt(*sc.RunAsUser, 10)+":"+strconv.FormatInt(*sc.RunAsGroup, 10)) {
		t.Errorf("the final stage %q does not run as the Deployment's uid/gid %d:%d", final, *sc.RunAsUser, *sc.RunAsGroup)
	}

	img := regexp.MustCompile(`(?m)^IMG \?= (\S+)$`).FindSubmatch(mustRead(t, filepath.Join("..", "Makefile")))
	if img == nil || string(img[1]) != c.Image {
		t.Errorf("the Makefile's IMG default %q is not the Deployment's image %q", img, c.Image)
	}

	copied := map[string]bool{} // what the build stage copies from the context
	for _, l := range lines {
		if f := strings.Fields(l); len(f) >= 3 && f[0] == "COPY" && !strings.HasPrefix(f[1], "--from") {
			for _, src := range f[1 : len(f)-1] {
				copied[strings.TrimSuffix(src, "/")] = true
			}
		}
	}
	cmd := "../cmd" + c.Command[0] // /manager, /gateway
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", cmd).Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v", cmd, err)
	}
	if !slices.ContainsFunc(lines, func(l string) bool {
		return strings.Contains(l, "go build") && strings.Contains(l, "-o "+c.Command[0]+" ./cmd"+c.Command[0])
	}) {
		t.Errorf("the Dockerfile does not build ./cmd%s into %s", c.Command[0], c.Command[0])
	}
	root, _ := filepath.Abs("..")
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a module dependency, downloaded in the image
		}
		if top := strings.Split(rel, string(filepath.Separator))[0]; !copied[top] {
			t.Errorf("%s imports %s, but the Dockerfile does not copy %s/", cmd, rel, top)
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if !copied[f] {
			t.Errorf("the Dockerfile does not copy %s", f)
		}
	}
}
