package kvm2

import (
	"errors"
	"strings"

	"github.com/digitalocean/go-libvirt"
	"golang.org/x/crypto/ssh/knownhosts"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// permanentCodes are the libvirt error numbers that no retry can fix: the request itself is
// wrong (bad XML, an unsupported or invalid argument), the user may not do it, or the pool
// it names does not exist.
var permanentCodes = map[libvirt.ErrorNumber]bool{
	libvirt.ErrXMLError:      true,
	libvirt.ErrNoSupport:     true,
	libvirt.ErrInvalidArg:    true,
	libvirt.ErrAuthFailed:    true,
	libvirt.ErrAccessDenied:  true,
	libvirt.ErrNoStoragePool: true,
}

// notFoundCodes say the domain or volume asked for does not exist.
var notFoundCodes = map[libvirt.ErrorNumber]bool{
	libvirt.ErrNoDomain:     true,
	libvirt.ErrNoStorageVol: true,
}

// classify attaches the provider error class to err. An error that already carries a class
// (validation, the image fetch, the dial) keeps it; everything not recognised as permanent
// or not-found is transient, so nothing is ever returned unclassified.
func classify(err error) error {
	return classifyAs(err, provider.ErrNotFound)
}

// classifyInCreate is classify for the steps of a Create, where a missing domain or volume
// means something vanished underneath a step in flight: worth a retry, and never NotFound,
// which the provider contract does not allow from Create.
func classifyInCreate(err error) error {
	return classifyAs(err, provider.ErrTransient)
}

func classifyAs(err, notFoundClass error) error {
	if err == nil {
		return nil
	}
	if provider.Class(err) != nil {
		return err
	}
	if code, ok := libvirtCode(err); ok {
		switch {
		case permanentCodes[code]:
			return provider.Permanent(err)
		case notFoundCodes[code]:
			return provider.WithClass(notFoundClass, err)
		}
		// ErrOperationInvalid (for example a domain that is not running) and every
		// code not listed above may clear on its own.
		return provider.Transient(err)
	}
	if sshRefused(err) {
		return provider.Permanent(err)
	}
	// Network errors, context ends, abandoned calls, a connection killed by another
	// caller and anything unrecognised: a retry on a fresh connection may succeed.
	return provider.Transient(err)
}

// libvirtCode returns the libvirt error number err carries, if it carries one.
func libvirtCode(err error) (libvirt.ErrorNumber, bool) {
	var lerr libvirt.Error
	if errors.As(err, &lerr) {
		return libvirt.ErrorNumber(lerr.Code), true
	}
	var lperr *libvirt.Error
	if errors.As(err, &lperr) && lperr != nil {
		return libvirt.ErrorNumber(lperr.Code), true
	}
	return 0, false
}

// sshRefused reports an SSH server that rejected the operator's key, or a host key that is
// missing from known_hosts or has changed. Neither clears without someone editing a file.
func sshRefused(err error) bool {
	var keyErr *knownhosts.KeyError
	if errors.As(err, &keyErr) {
		return true
	}
	// x/crypto/ssh reports a refused key only as text.
	return strings.Contains(err.Error(), "ssh: unable to authenticate")
}
