package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/config"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

// Context is a context cancelled at the end of the test.
func Context(t testing.TB) context.Context {
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	return ctx
}

// WaitFor is testutil.WaitFor, the tests' one polling helper, under the name the
// envtest tests have long used.
var WaitFor = testutil.WaitFor

var nsCounter atomic.Int64

// Namespace creates a namespace of the test's own, named prefix-<n>-<m>, and returns its
// name. Tests sharing one API server isolate themselves this way.
func (e *Env) Namespace(t testing.TB, ctx context.Context, prefix string) string {
	t.Helper()
	ns := fmt.Sprintf("%s-%d-%d", prefix, time.Now().UnixNano()%1e6, nsCounter.Add(1))
	if err := e.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
		t.Fatalf("creating namespace %s: %v", ns, err)
	}
	return ns
}

// NewManager returns a manager whose cache watches only ns, with its metrics and probe
// servers off and controller names free to repeat across tests; mutate, when not nil,
// adjusts the options first. Start it with StartManager.
func (e *Env) NewManager(t testing.TB, ns string, mutate func(*ctrl.Options)) ctrl.Manager {
	t.Helper()
	opts := ctrl.Options{
		Scheme:                 e.Scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
		Cache:                  cache.Options{DefaultNamespaces: map[string]cache.Config{ns: {}}},
		Controller:             config.Controller{SkipNameValidation: ptr.To(true)},
	}
	if mutate != nil {
		mutate(&opts)
	}
	mgr, err := ctrl.NewManager(e.Config, opts)
	if err != nil {
		t.Fatalf("creating manager: %v", err)
	}
	return mgr
}

// StartManager runs mgr until the test ends, then stops it and fails the test if it
// returned an error.
func StartManager(t testing.TB, ctx context.Context, mgr ctrl.Manager) {
	t.Helper()
	mctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("manager: %v", err)
		}
	})
}

// StatusManagers are the field managers that own fields of obj's status subresource,
// each with the raw set of fields it owns (managedFields' fieldsV1).
func StatusManagers(obj client.Object) map[string]string {
	owners := map[string]string{}
	for _, mf := range obj.GetManagedFields() {
		if mf.Subresource == "status" && mf.FieldsV1 != nil && strings.Contains(mf.FieldsV1.GetRawString(), `"f:status"`) {
			owners[mf.Manager] = mf.FieldsV1.GetRawString()
		}
	}
	return owners
}

// StatusOwnership checks that every status field of obj is owned by exactly one field
// manager, by server-side apply, and by one of managers. It returns one line per fault
// (a field with two owners, a manager not in managers, a status write by Update), none
// when the ownership is clean.
func StatusOwnership(obj client.Object, managers ...string) []string {
	allowed := map[string]bool{}
	for _, m := range managers {
		allowed[m] = true
	}
	owners := map[string][]string{}
	var faults []string
	for _, mf := range obj.GetManagedFields() {
		if mf.Subresource != "status" || mf.FieldsV1 == nil {
			continue
		}
		var fields map[string]any
		if err := json.Unmarshal(mf.FieldsV1.GetRawBytes(), &fields); err != nil {
			faults = append(faults, fmt.Sprintf("%s: fieldsV1 %v", mf.Manager, err))
			continue
		}
		status, _ := fields["f:status"].(map[string]any)
		if len(status) == 0 {
			continue
		}
		if mf.Operation != metav1.ManagedFieldsOperationApply {
			faults = append(faults, fmt.Sprintf("%s writes status by %s, not by server-side apply", mf.Manager, mf.Operation))
		}
		if !allowed[mf.Manager] {
			faults = append(faults, fmt.Sprintf("%s owns status fields; the writers are %v", mf.Manager, managers))
		}
		var walk func(prefix string, m map[string]any)
		walk = func(prefix string, m map[string]any) {
			for k, v := range m {
				if k == "." {
					continue
				}
				child, _ := v.(map[string]any)
				if len(child) == 0 || (len(child) == 1 && child["."] != nil) {
					owners[prefix+"."+k] = append(owners[prefix+"."+k], mf.Manager)
					continue
				}
				walk(prefix+"."+k, child)
			}
		}
		walk("status", status)
	}
	paths := make([]string, 0, len(owners))
	for p := range owners {
		paths = append(paths, p)
	}
	sort.Strings(paths)
	for _, p := range paths {
		if len(owners[p]) > 1 {
			faults = append(faults, fmt.Sprintf("%s is owned by %v", p, owners[p]))
		}
	}
	return faults
}
