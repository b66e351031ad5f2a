package hcloud

import (
	"slices"
	"strings"
	"testing"

	"go.opentelemetry.io/otel"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
)

// TestCallsAreTracedAndLogged: every request of a Create is a client span
// hcloud.<METHOD> <route> under the caller's span, and a V(1) line "hcloud call" with its
// route and status; neither the token nor the user-data shows in any line.
func TestCallsAreTracedAndLogged(t *testing.T) {
	e := newEnv(t)
	ctx, parent := otel.Tracer("test").Start(t.Context(), "test.create")
	const name = "proxy-00000000000000d1"
	if _, err := e.p.Create(ctx, request(name, "uid-d1")); err != nil {
		t.Fatal(err)
	}
	parent.End()
	var spans []string
	for _, s := range testSpans.Ended() {
		if s.Parent().SpanID() == parent.SpanContext().SpanID() {
			spans = append(spans, s.Name())
		}
	}
	for _, want := range []string{"hcloud.GET /servers", "hcloud.POST /servers", "hcloud.GET /actions"} {
		if !slices.Contains(spans, want) {
			t.Errorf("spans under the caller's %q lack %q", spans, want)
		}
	}
	logs := e.logs.String()
	if !strings.Contains(logs, `"method"="POST" "route"="/servers"`) || !strings.Contains(logs, `"status"=201`) {
		t.Errorf("no hcloud call line for the create in:\n%s", logs)
	}
	for _, secret := range []string{hcloudfake.Token, "SECRET-PROXY-PASSWORD"} {
		if strings.Contains(logs, secret) {
			t.Errorf("the logs hold %q", secret)
		}
	}
	if got := route("/v1/servers/42/actions/reset"); got != "/servers/{id}/actions/reset" {
		t.Errorf("route of a reset: %s", got)
	}
}
