//go:build deploy

package deploy

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

const (
	// crawlerImage is test/deploy/crawlerpod's image, built by hack/imagebuild.
	crawlerImage = "localhost/epo-crawlerpod:test-deploy"
	// crawlerSA is the crawlers' ServiceAccount, in the proxy's namespace and in otherNS,
	// each bound to the chart's crawler ClusterRole in its own namespace only.
	crawlerSA   = "deploy-test-crawler"
	otherNS     = "deploy-test-other-team"
	crawlerRole = release + "-crawler"
	tokenDir    = "/var/run/secrets/tokens"
)

// buildCrawlerImage builds test/deploy/crawlerpod statically and its image as a tarball,
// as hack/cluster.sh builds the sandbox image, and returns the tarball's path.
func buildCrawlerImage(t *testing.T, e env) string {
	t.Helper()
	dir := t.TempDir()
	bin, tar := filepath.Join(dir, "crawlerpod"), filepath.Join(dir, "crawlerpod.tar")
	// make test-deploy runs the tier with the Makefile's CGO_ENABLED=0 and -trimpath,
	// which the builds inherit: the dependencies' compile is make image-tar's.
	e.mustRun(t, "go", "build", "-ldflags=-s -w", "-o", bin, "./test/deploy/crawlerpod")
	e.mustRun(t, "go", "run", "./hack/imagebuild", "-bin", bin, "-path", "/crawlerpod", "-user", "65532:65532", "-ca", "",
		"-tag", crawlerImage, "-o", tar)
	return tar
}

// answer is one line of a crawler Pod's log.
type answer struct {
	URL    string `json:"url"`
	Status int    `json:"status"`
	Body   string `json:"body"`
	// Through the gateway (-proxy-token): its X-Egress-Proxy and X-Egress-IP headers.
	EgressProxy string `json:"egressProxy"`
	EgressIP    string `json:"egressIP"`
}

// checkCrawlerPods: a crawler Pod in the proxy's namespace, its ServiceAccount bound to
// the crawler ClusterRole there, calls discovery with its own projected token and gets
// that namespace's proxy (want), listed and picked, but not its credentials (no
// credentials role: refused for the namespace, none listed without one); a Pod of another namespace, bound there alone, gets no proxy and is
// refused the proxy's namespace.
func checkCrawlerPods(t *testing.T, e env, c client.Client, discovery, want string) {
	t.Helper()
	ctx := context.Background()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: otherNS}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Delete(context.Background(), ns) })
	list := discovery + "/v1/proxies?format=text"
	pods := map[string][]string{
		proxyNS: {list, list + "&namespace=" + proxyNS, discovery + "/v1/proxies/pick?key=deploy-test",
			list + "&credentials=true&namespace=" + proxyNS, list + "&credentials=true"},
		otherNS: {list, list + "&namespace=" + proxyNS},
	}
	for namespace, urls := range pods {
		e.mustRun(t, e.kubectl, "-n", namespace, "create", "serviceaccount", crawlerSA)
		// The command docs/discovery.md gives a namespace's crawler.
		e.mustRun(t, e.kubectl, "-n", namespace, "create", "rolebinding", crawlerSA,
			"--clusterrole="+crawlerRole, "--serviceaccount="+namespace+":"+crawlerSA)
		pod := crawlerPod(namespace, urls)
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() {
			ctx := context.Background()
			_ = c.Delete(ctx, pod)
			_, _ = e.run(ctx, e.kubectl, "-n", pod.Namespace, "delete", "rolebinding,serviceaccount", crawlerSA, "--ignore-not-found")
		})
	}

	got := map[string][]answer{}
	for namespace, urls := range pods {
		got[namespace] = crawlerAnswers(t, e, c, client.ObjectKey{Namespace: namespace, Name: crawlerSA}, len(urls))
	}
	mine, other := got[proxyNS], got[otherNS]
	expect := func(who string, a answer, status int, ok func(body string) bool, what string) {
		t.Helper()
		if a.Status != status || !ok(a.Body) {
			t.Errorf("%s: GET %s: %d %q, want %d and %s", who, a.URL, a.Status, a.Body, status, what)
		}
	}
	is := func(s string) func(string) bool { return func(b string) bool { return strings.TrimSpace(b) == s } }
	who := "the crawler Pod in " + proxyNS
	expect(who, mine[0], http.StatusOK, is(want), want+" alone")
	expect(who, mine[1], http.StatusOK, is(want), want+" alone")
	expect(who, mine[2], http.StatusOK, func(b string) bool {
		var p struct{ URL string }
		return json.Unmarshal([]byte(b), &p) == nil && p.URL == want
	}, "the pick "+want)
	// The refusal names the verb, the resource and the namespace, as Kubernetes words it.
	names := func(verb, resource string) func(string) bool {
		return func(b string) bool {
			var e struct{ Error string }
			return json.Unmarshal([]byte(b), &e) == nil && strings.Contains(e.Error, "cannot "+verb) &&
				strings.Contains(e.Error, `"`+resource+`"`) && strings.Contains(e.Error, `namespace "`+proxyNS+`"`)
		}
	}
	expect(who, mine[3], http.StatusForbidden, names("get", "proxies/credentials"), "a refusal of get on proxies/credentials in "+proxyNS)
	// Without a namespace, the answer comes from the namespaces where it may also get
	// credentials: none.
	expect(who, mine[4], http.StatusOK, is(""), "no proxy")
	who = "the crawler Pod in " + otherNS
	expect(who, other[0], http.StatusOK, is(""), "no proxy")
	expect(who, other[1], http.StatusForbidden, names("list", "proxies"), "a refusal of list on proxies in "+proxyNS)
}

// crawlerPod runs test/deploy/crawlerpod once with the namespace's crawler ServiceAccount,
// whose token comes from a serviceAccountToken projected volume only.
func crawlerPod(namespace string, urls []string) *corev1.Pod {
	return &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: namespace, Name: crawlerSA},
		Spec: corev1.PodSpec{
			ServiceAccountName:           crawlerSA,
			AutomountServiceAccountToken: ptr.To(false),
			RestartPolicy:                corev1.RestartPolicyNever,
			SecurityContext: &corev1.PodSecurityContext{RunAsNonRoot: ptr.To(true),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault}},
			Containers: []corev1.Container{{
				Name:            "crawler",
				Image:           crawlerImage,
				ImagePullPolicy: corev1.PullNever, // imported into the node, never pulled
				Args:            append([]string{"-token-file=" + tokenDir + "/discovery"}, urls...),
				VolumeMounts:    []corev1.VolumeMount{{Name: "discovery-token", MountPath: tokenDir, ReadOnly: true}},
				SecurityContext: &corev1.SecurityContext{AllowPrivilegeEscalation: ptr.To(false), ReadOnlyRootFilesystem: ptr.To(true),
					Capabilities: &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}}},
			}},
			Volumes: []corev1.Volume{{Name: "discovery-token", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
				Sources: []corev1.VolumeProjection{{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
					Path: "discovery", ExpirationSeconds: ptr.To[int64](600)}}},
			}}}},
		},
	}
}

// crawlerAnswers waits for the crawler Pod key to succeed and returns the n answers its
// log holds.
func crawlerAnswers(t *testing.T, e env, c client.Client, key client.ObjectKey, n int) []answer {
	t.Helper()
	var phase corev1.PodPhase
	testutil.WaitFor(t, 2*time.Minute, "crawler Pod "+key.String()+" to finish", func() (bool, error) {
		var p corev1.Pod
		if err := c.Get(context.Background(), key, &p); err != nil {
			return false, err
		}
		phase = p.Status.Phase
		return phase == corev1.PodSucceeded || phase == corev1.PodFailed, fmt.Errorf("phase %s", phase)
	}, testutil.Every(time.Second))
	logs := e.mustRun(t, e.kubectl, "-n", key.Namespace, "logs", key.Name)
	if phase != corev1.PodSucceeded {
		t.Fatalf("crawler Pod %s: %s:\n%s", key, phase, logs)
	}
	var out []answer
	sc := bufio.NewScanner(strings.NewReader(logs))
	sc.Buffer(nil, 2<<20)
	for sc.Scan() {
		var a answer
		if err := json.Unmarshal(sc.Bytes(), &a); err != nil {
			t.Fatalf("crawler Pod %s logged %q: %v", key, sc.Text(), err)
		}
		out = append(out, a)
	}
	if len(out) != n {
		t.Fatalf("crawler Pod %s logged %d answers, want %d:\n%s", key, len(out), n, logs)
	}
	return out
}
