package config_test

import (
	"bufio"
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

// deployed decodes the Deployment and every Service that config/default applies.
func deployed(t *testing.T) (appsv1.Deployment, []corev1.Service) {
	t.Helper()
	var (
		deps []appsv1.Deployment
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
				deps = append(deps, d)
			case "Service":
				var s corev1.Service
				decodeStrict(t, f, doc, &s)
				svcs = append(svcs, s)
			}
		}
	}
	if len(deps) != 1 {
		t.Fatalf("config/default applies %d Deployments, want the manager's alone", len(deps))
	}
	return deps[0], svcs
}

// bindPort is the port of --<flag>=host:port in args.
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
	t.Fatalf("the manager's args %v lack --%s", args, flag)
	return 0
}

// The Service that config/default applies reaches the manager's pods on the ports the
// manager listens on, so crawlers find the discovery API without a Service of their own.
func TestServiceReachesTheManager(t *testing.T) {
	d, svcs := deployed(t)
	if len(svcs) != 1 {
		t.Fatalf("config/default applies %d Services, want 1", len(svcs))
	}
	svc := svcs[0]
	pod := d.Spec.Template
	if len(svc.Spec.Selector) == 0 {
		t.Fatal("the Service has no selector")
	}
	for k, v := range svc.Spec.Selector {
		if pod.Labels[k] != v {
			t.Errorf("Service selector %s=%s does not match the manager's pod labels %v", k, v, pod.Labels)
		}
	}
	c := pod.Spec.Containers[0]
	containerPorts := map[string]int32{}
	for _, p := range c.Ports {
		containerPorts[p.Name] = p.ContainerPort
	}
	svcPorts := map[string]corev1.ServicePort{}
	for _, p := range svc.Spec.Ports {
		svcPorts[p.Name] = p
	}
	for name, flag := range map[string]string{"discovery": "discovery-bind-address", "metrics": "metrics-bind-address"} {
		listen := bindPort(t, c.Args, flag)
		sp, ok := svcPorts[name]
		if !ok {
			t.Errorf("the Service has no %s port; the manager listens on %d (--%s)", name, listen, flag)
			continue
		}
		if sp.Port != listen {
			t.Errorf("Service port %s is %d, the manager's --%s port is %d", name, sp.Port, flag, listen)
		}
		target := sp.TargetPort
		if target.Type == intstr.String {
			target = intstr.FromInt32(containerPorts[target.StrVal])
		}
		if target.IntVal != listen || containerPorts[name] != listen {
			t.Errorf("Service port %s targets %s (container port %d), the manager listens on %d", name, sp.TargetPort.String(), containerPorts[name], listen)
		}
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

// The image make docker-build produces is the one the Deployment runs, with the binary
// where the Deployment's command looks for it, and built from every directory the manager
// imports (a package outside the copied ones would fail only at docker build time).
func TestDockerfileBuildsWhatTheDeploymentRuns(t *testing.T) {
	d, _ := deployed(t)
	c := d.Spec.Template.Spec.Containers[0]
	lines := dockerfile(t)

	var final []string // the last stage, the image itself
	for i, l := range lines {
		if strings.HasPrefix(l, "FROM ") {
			final = lines[i:]
		}
	}
	if !slices.Contains(final, "COPY --from=builder "+c.Command[0]+" "+c.Command[0]) {
		t.Errorf("the final stage %q does not copy the binary to %s, the Deployment's command", final, c.Command[0])
	}
	if !slices.Contains(final, `ENTRYPOINT ["`+c.Command[0]+`"]`) {
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
	out, err := exec.Command("go", "list", "-deps", "-f", "{{if not .Standard}}{{.Dir}}{{end}}", "../cmd/manager").Output()
	if err != nil {
		t.Fatalf("go list -deps ../cmd/manager: %v", err)
	}
	root, _ := filepath.Abs("..")
	for _, dir := range strings.Fields(string(out)) {
		rel, err := filepath.Rel(root, dir)
		if err != nil || strings.HasPrefix(rel, "..") {
			continue // a module dependency, downloaded in the image
		}
		if top := strings.Split(rel, string(filepath.Separator))[0]; !copied[top] {
			t.Errorf("the manager imports %s, but the Dockerfile does not copy %s/", rel, top)
		}
	}
	for _, f := range []string{"go.mod", "go.sum"} {
		if !copied[f] {
			t.Errorf("the Dockerfile does not copy %s", f)
		}
	}
}
