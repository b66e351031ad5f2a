//go:build deploy

package deploy

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/test/framework"
)

const (
	// gatewayName is the chart's gateway Deployment and Service.
	gatewayName = release + "-gateway"
	// gatewayPod is the crawler Pod that uses the gateway, in the proxy's namespace and in
	// otherNS, each with that namespace's crawlerSA.
	gatewayPod = "deploy-test-gateway-crawler"
	// gatewayRequests is how many requests the gateway's crawler Pod sends.
	gatewayRequests = 3
)

// waitGatewayAvailable waits for the gateway's Deployment to be Available with its two
// replicas ready (readiness: the gateway's /readyz, true once its cache has synced and it
// serves).
func waitGatewayAvailable(t *testing.T, c client.Client) {
	t.Helper()
	testutil.WaitFor(t, 5*time.Minute, "Deployment "+gatewayName+" Available with 2 ready replicas (readiness: the gateway's /readyz)", func() (bool, error) {
		var d appsv1.Deployment
		if err := c.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: gatewayName}, &d); err != nil {
			return false, err
		}
		available := false
		for _, cond := range d.Status.Conditions {
			available = available || (cond.Type == appsv1.DeploymentAvailable && cond.Status == corev1.ConditionTrue)
		}
		return available && d.Status.ReadyReplicas == 2 && d.Status.UpdatedReplicas == 2,
			fmt.Errorf("available %v, replicas %d, ready %d, updated %d", available, d.Status.Replicas, d.Status.ReadyReplicas, d.Status.UpdatedReplicas)
	}, testutil.Every(time.Second))
}

// gatewayPods waits for the gateway's Deployment and returns its two ready pods.
func gatewayPods(t *testing.T, c client.Client) []corev1.Pod {
	t.Helper()
	waitGatewayAvailable(t, c)
	var pods []corev1.Pod
	testutil.WaitFor(t, time.Minute, "the gateway's 2 ready pods", func() (bool, error) {
		var list corev1.PodList
		if err := c.List(context.Background(), &list, client.InNamespace(namespace), client.MatchingLabels{"app.kubernetes.io/component": "gateway"}); err != nil {
			return false, err
		}
		pods = pods[:0]
		for _, p := range list.Items {
			if p.DeletionTimestamp == nil && podReady(p) {
				pods = append(pods, p)
			}
		}
		return len(pods) == 2, fmt.Errorf("%d ready pods", len(pods))
	}, testutil.Every(time.Second))
	return pods
}

// gatewayCrawlerPod is crawlerPod using the gateway: HTTP_PROXY names the gateway's
// Service with the caller's options in the user name (docs/gateway.md), and crawlerpod
// -proxy-token adds the Pod's own projected ServiceAccount token as the proxy password.
func gatewayCrawlerPod(ns, proxyURL string, urls []string) *corev1.Pod {
	pod := crawlerPod(ns, nil)
	pod.Name = gatewayPod
	ctr := &pod.Spec.Containers[0]
	ctr.Args = append(append([]string{"-proxy-token"}, ctr.Args...), urls...)
	ctr.Env = []corev1.EnvVar{{Name: "HTTP_PROXY", Value: proxyURL}}
	return pod
}

// checkGateway: the chart's gateway Deployment runs (two replicas ready); a crawler Pod in
// the proxy's namespace, whose ServiceAccount the crawler ClusterRole is bound to there
// (checkCrawlerPods made it), sends plain-HTTP requests to the test's site through the
// gateway's Service by HTTP_PROXY, its own token as the proxy password: each is answered
// 200 by the site, which sees them come from the Proxy's address, with X-Egress-Proxy
// naming that Proxy. The same crawler of another namespace asking for the proxy's
// namespace is refused with 407, naming the namespace.
func checkGateway(t *testing.T, e env, c client.Client, who *framework.Whoami, site string, ready *v1alpha1.Proxy) {
	t.Helper()
	ctx := context.Background()
	waitGatewayAvailable(t, c)
	var svc corev1.Service
	if err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: gatewayName}, &svc); err != nil {
		t.Fatal(err)
	}
	port := int32(0)
	for _, p := range svc.Spec.Ports {
		if p.Name == "proxy" {
			port = p.Port
		}
	}
	if port == 0 {
		t.Fatalf("Service %s has no port named proxy: %+v", gatewayName, svc.Spec.Ports)
	}
	gateway := fmt.Sprintf("%s:%d", svc.Spec.ClusterIP, port)

	var urls []string
	for i := range gatewayRequests {
		urls = append(urls, fmt.Sprintf("%s/through-the-gateway-%d", site, i))
	}
	before := who.From(ready.Status.IP)
	pods := map[string]*corev1.Pod{
		// The user name's grammar: the caller's name, then +ns=<namespace>.
		proxyNS: gatewayCrawlerPod(proxyNS, "http://deploy-test+ns="+proxyNS+"@"+gateway, urls),
		otherNS: gatewayCrawlerPod(otherNS, "http://deploy-test+ns="+proxyNS+"@"+gateway, urls[:1]),
	}
	for _, pod := range pods {
		if err := c.Create(ctx, pod); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Delete(context.Background(), pod) })
	}

	want := proxyNS + "/" + ready.Name
	for _, a := range crawlerAnswers(t, e, c, client.ObjectKeyFromObject(pods[proxyNS]), len(urls)) {
		if a.Status != http.StatusOK || a.EgressProxy != want {
			t.Errorf("the crawler Pod in %s: GET %s through the gateway: %d, X-Egress-Proxy %q, X-Egress-IP %q: %.300s; want 200 through %s",
				proxyNS, a.URL, a.Status, a.EgressProxy, a.EgressIP, a.Body, want)
		}
		if a.EgressIP != "" && a.EgressIP != ready.Status.IP {
			t.Errorf("GET %s through the gateway: X-Egress-IP %q, the Proxy's address is %s", a.URL, a.EgressIP, ready.Status.IP)
		}
	}
	if n := who.From(ready.Status.IP) - before; n < gatewayRequests {
		t.Errorf("the site saw %d requests from the Proxy's address %s since the gateway's crawler started, want at least %d", n, ready.Status.IP, gatewayRequests)
	}
	other := crawlerAnswers(t, e, c, client.ObjectKeyFromObject(pods[otherNS]), 1)[0]
	if other.Status != http.StatusProxyAuthRequired || !strings.Contains(other.Body, `may not use namespace "`+proxyNS+`"`) || other.EgressProxy != "" {
		t.Errorf("the crawler Pod in %s asking the gateway for %s: %d %q (X-Egress-Proxy %q), want 407 naming the namespace", otherNS, proxyNS, other.Status, other.Body, other.EgressProxy)
	}
}
