package hcloud

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/hcloudfake"
)

// classNamed is the class a Mapping names.
func classNamed(t *testing.T, name string) error {
	t.Helper()
	switch name {
	case "permanent":
		return provider.ErrPermanent
	case "quota":
		return provider.ErrQuotaExceeded
	case "transient":
		return provider.ErrTransient
	case "notfound":
		// On a create a missing reference is permanent.
		return provider.ErrPermanent
	}
	t.Fatalf("Mappings name class %q", name)
	return nil
}

// TestCreateErrorMapping: every code of Mappings, answered synchronously to the server's
// create with the status the real API gives it (hcloudfake.StatusOf), and the class and
// message Create returns. uniqueness_error makes Create read the server again and go on.
// Whatever failed, the next Create succeeds.
func TestCreateErrorMapping(t *testing.T) {
	for _, m := range Mappings {
		t.Run(string(m.Code), func(t *testing.T) {
			e := newEnv(t)
			const name = "proxy-00000000000000e1"
			e.fake.Fail(hcloudfake.ServersCreate, hcloudfake.Failure{Code: string(m.Code)})
			inst, err := e.p.Create(t.Context(), request(name, "uid-1"))
			if m.Class == "adopt" {
				if err != nil || inst.State != provider.StateRunning || e.fake.CallCount(hcloudfake.ServersCreate) != 2 {
					t.Fatalf("create after %s: %+v, %v, %d creates; want it read again and built", m.Code, inst, err, e.fake.CallCount(hcloudfake.ServersCreate))
				}
				return
			}
			if got, want := provider.Class(err), classNamed(t, m.Class); got != want {
				t.Errorf("class %v, want %v: %v", got, want, err)
			}
			if err == nil || !strings.Contains(err.Error(), string(m.Code)) || !strings.Contains(err.Error(), "creating server "+name) {
				t.Errorf("error %v does not hold %q and the call", err, m.Code)
			}
			if (m.Code == "unauthorized" || m.Code == "forbidden") && !strings.Contains(err.Error(), "hcloud.tokenFile "+e.tokenFile) {
				t.Errorf("error %v does not name hcloud.tokenFile and its path", err)
			}
			if inst, err := e.p.Create(t.Context(), request(name, "uid-1")); err != nil || inst.State != provider.StateRunning {
				t.Fatalf("second create: %+v, %v", inst, err)
			}
		})
	}
}

// TestFailedActionErrorMapping: every code of Mappings as the error of a create_server
// action that fails after the create was accepted: the class of its code (a not_found
// there is ErrNotFound turned transient: what the action worked on vanished), and the
// server the failed action left behind is deleted, so the next Create builds it afresh.
func TestFailedActionErrorMapping(t *testing.T) {
	for _, m := range Mappings {
		if m.Class == "adopt" {
			continue // not what an action ends with
		}
		t.Run(string(m.Code), func(t *testing.T) {
			e := newEnv(t)
			const name = "proxy-00000000000000e2"
			e.fake.Fail(hcloudfake.ServersCreate, hcloudfake.Failure{ActionCode: string(m.Code), Message: "injected action failure"})
			_, err := e.p.Create(t.Context(), request(name, "uid-2"))
			want := classNamed(t, m.Class)
			if m.Class == "notfound" {
				want = provider.ErrTransient
			}
			if got := provider.Class(err); got != want {
				t.Errorf("class %v, want %v: %v", got, want, err)
			}
			if err == nil || !strings.Contains(err.Error(), string(m.Code)) || !strings.Contains(err.Error(), "action create_server") {
				t.Errorf("error %v does not name the action and %q", err, m.Code)
			}
			if id := e.serverID(name); id != 0 {
				t.Errorf("the server of the failed create is still there (ID %d)", id)
			}
			if inst, err := e.p.Create(t.Context(), request(name, "uid-2")); err != nil || inst.State != provider.StateRunning {
				t.Fatalf("second create: %+v, %v", inst, err)
			}
		})
	}
}

// TestUnlistedCodesByStatus: a code Mappings does not list is classed by its status: 5xx
// transient, other 4xx permanent; an answer without an error body the same way.
func TestUnlistedCodesByStatus(t *testing.T) {
	for _, c := range []struct {
		f    hcloudfake.Failure
		want error
	}{
		{hcloudfake.Failure{Code: "some_new_code", Status: 503}, provider.ErrTransient},
		{hcloudfake.Failure{Code: "some_new_code", Status: 422}, provider.ErrPermanent},
	} {
		e := newEnv(t)
		e.fake.Fail(hcloudfake.ServersCreate, c.f)
		if _, err := e.p.Create(t.Context(), request("proxy-00000000000000e3", "uid-3")); provider.Class(err) != c.want {
			t.Errorf("%+v: %v, want %s", c.f, err, provider.ClassName(c.want))
		}
	}
}

// TestRateLimitCarriesItsReset: a 429 rate_limit_exceeded names when the limit resets,
// from RateLimit-Reset, and RetryAfter returns the wait.
func TestRateLimitCarriesItsReset(t *testing.T) {
	e := newEnv(t)
	e.fake.Fail(hcloudfake.ServersList, hcloudfake.Failure{Code: "rate_limit_exceeded", ResetAfter: 90 * time.Second})
	_, err := e.p.Get(t.Context(), ProviderID("proxy-00000000000000e4"))
	if provider.Class(err) != provider.ErrTransient || !strings.Contains(err.Error(), "the limit resets at ") {
		t.Fatalf("rate limited get: %v, want transient naming the reset", err)
	}
	d, ok := RetryAfter(err)
	if !ok || d < 80*time.Second || d > 91*time.Second {
		t.Errorf("RetryAfter: %v, %v; want about 90s", d, ok)
	}
	if _, ok := RetryAfter(errors.New("other")); ok {
		t.Error("RetryAfter of an unrelated error")
	}
}

// TestRateLimitResetIsTheRetryAfter: the reset of a rate-limited Create, Get or Delete
// is the wait provider.RetryAfter returns, which the Proxy reconciler requeues after.
func TestRateLimitResetIsTheRetryAfter(t *testing.T) {
	e := newEnv(t)
	limited := hcloudfake.Failure{Code: "rate_limit_exceeded", ResetAfter: 90 * time.Second}
	e.fake.Fail(hcloudfake.ServersList, limited)
	_, errCreate := e.p.Create(t.Context(), request("proxy-00000000000000e5", "uid-5"))
	e.fake.Fail(hcloudfake.ServersList, limited)
	_, errGet := e.p.Get(t.Context(), ProviderID("proxy-00000000000000e5"))
	e.fake.Fail(hcloudfake.ServersList, limited)
	errDelete := e.p.Delete(t.Context(), ProviderID("proxy-00000000000000e5"))
	for op, err := range map[string]error{"create": errCreate, "get": errGet, "delete": errDelete} {
		if d := provider.RetryAfter(err); provider.Class(err) != provider.ErrTransient || d < 80*time.Second || d > 91*time.Second {
			t.Errorf("rate limited %s: %v, provider.RetryAfter %s; want transient and about 90s", op, err, d)
		}
	}
	e.fake.Fail(hcloudfake.ServersList, hcloudfake.Failure{Code: "server_error"})
	if _, err := e.p.Get(t.Context(), ProviderID("proxy-00000000000000e5")); provider.RetryAfter(err) != 0 {
		t.Errorf("server_error: provider.RetryAfter %s, want 0", provider.RetryAfter(err))
	}
}

// TestInvalidInputNamesTheField: an invalid_input answer names each field the API
// refused and what it stands for in the Proxy's spec or the config.
func TestInvalidInputNamesTheField(t *testing.T) {
	e := newEnv(t)
	e.fake.Fail(hcloudfake.ServersCreate, hcloudfake.Failure{Code: "invalid_input", Message: "invalid input in field 'server_type'",
		Fields: map[string][]string{"server_type": {"server type cx23 is not available"}}})
	_, err := e.p.Create(t.Context(), request("proxy-00000000000000e5", "uid-5"))
	want := "field server_type (placement.machineType (hcloud.serverTypes)): server type cx23 is not available"
	if provider.Class(err) != provider.ErrPermanent || !strings.Contains(fmt.Sprint(err), want) {
		t.Errorf("%v, want permanent holding %q", err, want)
	}
}

// TestOtherCallsErrorMapping: Get, Delete, Reboot and ListByTag classes.
func TestOtherCallsErrorMapping(t *testing.T) {
	e := newEnv(t)
	inst, err := e.p.Create(t.Context(), request("proxy-00000000000000e6", "uid-6"))
	if err != nil {
		t.Fatal(err)
	}
	e.fake.Fail(hcloudfake.ServersList, hcloudfake.Failure{Code: "server_error"})
	if _, err := e.p.Get(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrTransient {
		t.Errorf("get answered 500: %v, want transient", err)
	}
	e.fake.Fail(hcloudfake.ServersDelete, hcloudfake.Failure{Code: "locked"})
	if err := e.p.Delete(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrTransient {
		t.Errorf("delete answered locked: %v, want transient", err)
	}
	e.fake.Fail(hcloudfake.ServersDelete, hcloudfake.Failure{Code: "protected"})
	if err := e.p.Delete(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrPermanent {
		t.Errorf("delete answered protected: %v, want permanent", err)
	}
	e.fake.Fail(hcloudfake.ServersList, hcloudfake.Failure{Code: "unauthorized"})
	if err := e.p.Delete(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrTransient || !strings.Contains(err.Error(), "hcloud.tokenFile") {
		t.Errorf("delete answered unauthorized: %v, want transient naming the token file (a permanent Delete lets the Proxy go)", err)
	}
	e.fake.Fail(hcloudfake.ServersReset, hcloudfake.Failure{Code: "locked"})
	if err := e.p.Reboot(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrTransient {
		t.Errorf("reset answered locked: %v, want transient", err)
	}
	e.fake.Fail(hcloudfake.FirewallsList, hcloudfake.Failure{Code: "server_error"})
	if list, err := e.p.ListByTag(t.Context()); provider.Class(err) != provider.ErrTransient || list != nil {
		t.Errorf("list answered 500: %v, %v; want transient and nothing", list, err)
	}
	if err := e.p.Delete(t.Context(), inst.ProviderID); err != nil {
		t.Fatalf("delete after the failures: %v", err)
	}
	if _, err := e.p.Get(t.Context(), inst.ProviderID); provider.Class(err) != provider.ErrNotFound {
		t.Errorf("get after delete: %v, want not found", err)
	}
	for _, id := range []string{"hcloud:/x", "gce://p/z/proxy-1", "hcloud://Not_A_Name", "hcloud://"} {
		if _, err := e.p.Get(t.Context(), id); provider.Class(err) != provider.ErrPermanent {
			t.Errorf("get %s: %v, want permanent", id, err)
		}
	}
}

// TestErrorMappingTableInDocs: the error mapping table of docs/hcloud-provider.md is the
// one rendered from Mappings.
func TestErrorMappingTableInDocs(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/hcloud-provider.md")
	if err != nil {
		t.Fatal(err)
	}
	if want := errorMappingTable(); !strings.Contains(string(doc), want) {
		t.Errorf("docs/hcloud-provider.md does not hold the error mapping table of Mappings; it should read:\n%s", want)
	}
}

// errorMappingTable renders Mappings as the docs' markdown table.
func errorMappingTable() string {
	verdict := map[string]string{
		"transient": "ErrTransient",
		"quota":     "ErrQuotaExceeded: retried after `--quota-retry`",
		"permanent": "ErrPermanent",
		"notfound":  "ErrNotFound (see the left column)",
		"adopt":     "the resource is read again and adopted (or refused, by the ownership rules)",
	}
	var b strings.Builder
	b.WriteString("| what the API says | class |\n|---|---|\n")
	for _, m := range Mappings {
		fmt.Fprintf(&b, "| %s | %s |\n", m.Says, verdict[m.Class])
	}
	b.WriteString("| another code: by its HTTP status (5xx and 429, or no error body with those) | ErrTransient |\n")
	b.WriteString("| another code: any other status; a failed action's unlisted code | ErrPermanent |\n")
	b.WriteString("| no HTTP answer (network, deadline); the token file missing, unreadable or empty | ErrTransient |\n")
	return b.String()
}
