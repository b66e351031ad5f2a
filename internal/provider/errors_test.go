package provider

import (
	"errors"
	"fmt"
	"testing"
)

// OwnedByOther keeps the provider's message, is permanent for the reconciler's class
// switch, and carries the marker that tells the reconciler the cause may clear.
func TestOwnedByOther(t *testing.T) {
	cause := fmt.Errorf("domain proxy-1 on host hv1 belongs to UID %s, not %s", "old", "new")
	err := OwnedByOther(cause)
	if err.Error() != cause.Error() {
		t.Errorf("Error() = %q, want the cause's text %q", err, cause)
	}
	for _, target := range []error{ErrPermanent, ErrOwnedByOther, cause} {
		if !errors.Is(err, target) {
			t.Errorf("errors.Is(%q, %v) = false", err, target)
		}
	}
	if Class(err) != ErrPermanent || ClassName(err) != "permanent" {
		t.Errorf("class %v (%s), want permanent", Class(err), ClassName(err))
	}
	if errors.Is(Permanent(cause), ErrOwnedByOther) {
		t.Error("a plain permanent error carries the owned-by-other marker")
	}
	if OwnedByOther(nil) != nil {
		t.Error("OwnedByOther(nil) is not nil")
	}
}
