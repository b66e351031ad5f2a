package libvirtfake

import (
	"fmt"

	"github.com/digitalocean/go-libvirt"
)

// prefixes holds libvirt's own wording for the error codes the fake and its
// users produce (virErrorMsg in libvirt's virerror.c): the message of an
// error is "<prefix>: <detail>".
var prefixes = map[libvirt.ErrorNumber]string{
	libvirt.ErrInternalError:     "internal error",
	libvirt.ErrNoSupport:         "this function is not supported by the connection driver",
	libvirt.ErrInvalidArg:        "invalid argument",
	libvirt.ErrOperationFailed:   "operation failed",
	libvirt.ErrXMLError:          "XML error",
	libvirt.ErrNoDomain:          "Domain not found",
	libvirt.ErrAuthFailed:        "authentication failed",
	libvirt.ErrNoStoragePool:     "Storage pool not found",
	libvirt.ErrNoStorageVol:      "Storage volume not found",
	libvirt.ErrOperationInvalid:  "Requested operation is not valid",
	libvirt.ErrNoDomainMetadata:  "metadata not found",
	libvirt.ErrAgentUnresponsive: "Guest agent is not responding",
	libvirt.ErrAccessDenied:      "access denied",
	libvirt.ErrOperationTimeout:  "Timed out during operation",
	libvirt.ErrStorageVolExist:   "storage volume already exists",
}

// Errorf returns the libvirt.Error libvirtd would send for code with the
// given detail: the message carries libvirt's prefix for the code, so
// Errorf(libvirt.ErrAccessDenied, "'%s' denied", "x") reads
// "access denied: 'x' denied". Codes without a known prefix (ErrSystemError,
// ErrRPC, ...) carry the detail alone, as libvirt's do.
func Errorf(code libvirt.ErrorNumber, format string, args ...any) libvirt.Error {
	msg := fmt.Sprintf(format, args...)
	if p, ok := prefixes[code]; ok {
		msg = p + ": " + msg
	}
	return libvirt.Error{Code: uint32(code), Message: msg}
}

func errNoDomainName(name string) error {
	return Errorf(libvirt.ErrNoDomain, "no domain with matching name '%s'", name)
}

func errNoDomainUUID(d libvirt.Domain) error {
	return Errorf(libvirt.ErrNoDomain, "no domain with matching uuid '%s' (%s)", FormatUUID(d.UUID), d.Name)
}

func errNoPoolName(name string) error {
	return Errorf(libvirt.ErrNoStoragePool, "no storage pool with matching name '%s'", name)
}

func errNoPoolUUID(p libvirt.StoragePool) error {
	return Errorf(libvirt.ErrNoStoragePool, "no storage pool with matching uuid '%s' (%s)", FormatUUID(p.UUID), p.Name)
}

func errPoolInactive(name string) error {
	return Errorf(libvirt.ErrOperationInvalid, "storage pool '%s' is not active", name)
}

func errNoVolName(name string) error {
	return Errorf(libvirt.ErrNoStorageVol, "no storage vol with matching name '%s'", name)
}

func errVolExists(name string) error {
	return libvirt.Error{Code: uint32(libvirt.ErrStorageVolExist),
		Message: fmt.Sprintf("storage volume '%s' exists already", name)}
}

func errVolInUse(name string) error {
	return Errorf(libvirt.ErrOperationInvalid, "volume '%s' is still in use.", name)
}

func errNoMetadata() error {
	return Errorf(libvirt.ErrNoDomainMetadata, "Requested metadata element is not present")
}

func errDomainActive() error {
	return Errorf(libvirt.ErrOperationInvalid, "domain is already running")
}

func errDomainInactive() error {
	return Errorf(libvirt.ErrOperationInvalid, "domain is not running")
}

func errAgentNotConnected() error {
	return Errorf(libvirt.ErrAgentUnresponsive, "QEMU guest agent is not connected")
}

// systemError is libvirt's virReportSystemError: the detail, a colon and the
// errno's text.
func systemError(errno string, format string, args ...any) error {
	return libvirt.Error{Code: uint32(libvirt.ErrSystemError),
		Message: fmt.Sprintf(format, args...) + ": " + errno}
}
