package kvm2

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh/knownhosts"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

func lverr(code libvirt.ErrorNumber) error {
	return libvirt.Error{Code: uint32(code), Message: "libvirt says " + code.String()}
}

func TestClassify(t *testing.T) {
	wrapped := func(err error) error { return fmt.Errorf("looking up domain proxy-1 on host h1: %w", err) }
	tests := []struct {
		name     string
		err      error
		want     error // class from classify
		inCreate error // class from classifyInCreate
	}{
		{"xml error", lverr(libvirt.ErrXMLError), provider.ErrPermanent, provider.ErrPermanent},
		{"no support", lverr(libvirt.ErrNoSupport), provider.ErrPermanent, provider.ErrPermanent},
		{"invalid arg", wrapped(lverr(libvirt.ErrInvalidArg)), provider.ErrPermanent, provider.ErrPermanent},
		{"auth failed", lverr(libvirt.ErrAuthFailed), provider.ErrPermanent, provider.ErrPermanent},
		{"access denied", lverr(libvirt.ErrAccessDenied), provider.ErrPermanent, provider.ErrPermanent},
		{"no storage pool", lverr(libvirt.ErrNoStoragePool), provider.ErrPermanent, provider.ErrPermanent},
		{"no domain", wrapped(lverr(libvirt.ErrNoDomain)), provider.ErrNotFound, provider.ErrTransient},
		{"no storage vol", lverr(libvirt.ErrNoStorageVol), provider.ErrNotFound, provider.ErrTransient},
		{"operation invalid", lverr(libvirt.ErrOperationInvalid), provider.ErrTransient, provider.ErrTransient},
		{"unknown libvirt code", libvirt.Error{Code: 9999, Message: "new in libvirt 42"}, provider.ErrTransient, provider.ErrTransient},
		{"internal error code", lverr(libvirt.ErrInternalError), provider.ErrTransient, provider.ErrTransient},
		{"ssh key refused", errors.New("ssh: handshake failed: ssh: unable to authenticate, attempted methods [none publickey], no supported methods remain"),
			provider.ErrPermanent, provider.ErrPermanent},
		{"host key unknown", fmt.Errorf("ssh: handshake failed: %w", &knownhosts.KeyError{}), provider.ErrPermanent, provider.ErrPermanent},
		{"host key changed", fmt.Errorf("ssh: handshake failed: %w", &knownhosts.KeyError{Want: []knownhosts.KnownKey{{}}}),
			provider.ErrPermanent, provider.ErrPermanent},
		{"tcp refused", &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}, provider.ErrTransient, provider.ErrTransient},
		{"connection reset", fmt.Errorf("read: %w", syscall.ECONNRESET), provider.ErrTransient, provider.ErrTransient},
		{"eof", io.EOF, provider.ErrTransient, provider.ErrTransient},
		{"interrupted", libvirt.ErrInterrupted, provider.ErrTransient, provider.ErrTransient},
		{"cancelled", fmt.Errorf("abandoned: %w", context.Canceled), provider.ErrTransient, provider.ErrTransient},
		{"deadline", context.DeadlineExceeded, provider.ErrTransient, provider.ErrTransient},
		{"unrecognised", errors.New("something odd"), provider.ErrTransient, provider.ErrTransient},
		{"already permanent", provider.Permanent(errors.New("parsing ssh key file /k: ssh: no key found")), provider.ErrPermanent, provider.ErrPermanent},
		{"already transient libvirt", provider.Transient(lverr(libvirt.ErrXMLError)), provider.ErrTransient, provider.ErrTransient},
		{"already quota", provider.QuotaExceeded(errors.New("pool full")), provider.ErrQuotaExceeded, provider.ErrQuotaExceeded},
		{"already not found", provider.NotFound(lverr(libvirt.ErrNoDomain)), provider.ErrNotFound, provider.ErrNotFound},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for _, c := range []struct {
				fn   func(error) error
				name string
				want error
			}{{classify, "classify", tt.want}, {classifyInCreate, "classifyInCreate", tt.inCreate}} {
				got := c.fn(tt.err)
				if cls := provider.Class(got); cls != c.want {
					t.Errorf("%s(%v): class %v, want %v", c.name, tt.err, cls, c.want)
				}
				if !errors.Is(got, tt.err) {
					t.Errorf("%s(%v) lost the cause", c.name, tt.err)
				}
				if got.Error() != tt.err.Error() {
					t.Errorf("%s changed the message: %q, want %q", c.name, got, tt.err)
				}
			}
		})
	}
	if classify(nil) != nil || classifyInCreate(nil) != nil {
		t.Error("classify(nil) must be nil")
	}
}

func TestClassifyKeepsLibvirtCodeReadable(t *testing.T) {
	err := classify(fmt.Errorf("defining domain: %w", lverr(libvirt.ErrXMLError)))
	code, ok := libvirtCode(err)
	if !ok || code != libvirt.ErrXMLError {
		t.Fatalf("libvirtCode = %v, %v; want ErrXMLError", code, ok)
	}
}
