package kvm2

import (
	"io"

	"github.com/digitalocean/go-libvirt"
)

// backend is the seam between the provider and libvirt: exactly the libvirt calls the
// provider makes, with go-libvirt's own signatures and types. The production
// implementation is go-libvirt over a forwarded unix socket; tests use an in-memory
// libvirt behind the same interface, and the observe decorator wraps either.
type backend interface {
	ConnectGetLibVersion() (uint64, error)
	ConnectGetHostname() (string, error)
	ConnectListAllDomains(needResults int32, flags libvirt.ConnectListAllDomainsFlags) ([]libvirt.Domain, uint32, error)

	StoragePoolLookupByName(name string) (libvirt.StoragePool, error)
	StoragePoolGetInfo(pool libvirt.StoragePool) (state uint8, capacity, allocation, available uint64, err error)
	StoragePoolRefresh(pool libvirt.StoragePool, flags uint32) error

	StorageVolLookupByName(pool libvirt.StoragePool, name string) (libvirt.StorageVol, error)
	StorageVolCreateXML(pool libvirt.StoragePool, xml string, flags libvirt.StorageVolCreateFlags) (libvirt.StorageVol, error)
	StorageVolGetPath(vol libvirt.StorageVol) (string, error)
	StorageVolGetInfo(vol libvirt.StorageVol) (typ int8, capacity, allocation uint64, err error)
	StorageVolDelete(vol libvirt.StorageVol, flags libvirt.StorageVolDeleteFlags) error
	StorageVolUpload(vol libvirt.StorageVol, r io.Reader, offset, length uint64, flags libvirt.StorageVolUploadFlags) error
	StorageVolDownload(vol libvirt.StorageVol, w io.Writer, offset, length uint64, flags libvirt.StorageVolDownloadFlags) error

	DomainLookupByName(name string) (libvirt.Domain, error)
	DomainDefineXMLFlags(xml string, flags libvirt.DomainDefineFlags) (libvirt.Domain, error)
	DomainCreate(dom libvirt.Domain) error
	DomainGetState(dom libvirt.Domain, flags uint32) (state int32, reason int32, err error)
	DomainGetMetadata(dom libvirt.Domain, typ int32, uri libvirt.OptString, flags libvirt.DomainModificationImpact) (string, error)
	DomainInterfaceAddresses(dom libvirt.Domain, source uint32, flags uint32) ([]libvirt.DomainInterface, error)
	DomainDestroyFlags(dom libvirt.Domain, flags libvirt.DomainDestroyFlagsValues) error
	DomainUndefineFlags(dom libvirt.Domain, flags libvirt.DomainUndefineFlagsValues) error
}

// *libvirt.Libvirt is the production backend.
var _ backend = (*libvirt.Libvirt)(nil)
