package proxy

import (
	"errors"
	"testing"
	"time"

	"github.com/go-logr/logr"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// waitError is a transient cause that says when a retry can succeed, as hcloud's
// rate-limited answers do.
type waitError struct{ d time.Duration }

func (e waitError) Error() string             { return "rate limited" }
func (e waitError) RetryAfter() time.Duration { return e.d }

// TestTransientErrorWaitsItsRetryAfter: a transient provider error that carries a wait
// (provider.RetryAfter) is asked again after that wait, rounded up to a second and at
// most maxErrorBackoff, with no error (off the backoff curve), its message on the
// Provisioned condition; one without a wait goes back on the curve.
func TestTransientErrorWaitsItsRetryAfter(t *testing.T) {
	r := &ProxyReconciler{}
	r.setDefaults()
	for _, tc := range []struct {
		name string
		err  error
		want time.Duration
	}{
		{"wait", provider.Transient(waitError{41500 * time.Millisecond}), 42 * time.Second},
		{"capped", provider.Transient(waitError{time.Hour}), maxErrorBackoff},
		{"over", provider.Transient(waitError{-time.Second}), 0},
		{"none", provider.Transient(errors.New("connection reset")), 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &scope{px: &v1alpha1.Proxy{}, log: logr.Discard(), r: r}
			res, err := r.providerError(s, common.ActionCreate, tc.err, true)
			if tc.want == 0 {
				if err == nil || res.RequeueAfter != 0 {
					t.Fatalf("result %+v, %v; want the error back for the backoff curve", res, err)
				}
				return
			}
			if err != nil || res.RequeueAfter != tc.want {
				t.Fatalf("result %+v, %v; want RequeueAfter %s and no error", res, err, tc.want)
			}
			if c := provisioned(s.px); c.Reason != v1alpha1.ReasonTransientError || c.Message != "rate limited" {
				t.Fatalf("Provisioned %+v", c)
			}
		})
	}
}
