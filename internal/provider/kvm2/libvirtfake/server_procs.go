package libvirtfake

import (
	"bytes"

	"github.com/davecgh/go-xdr/xdr2"
	"github.com/digitalocean/go-libvirt"
)

// procedure is one remote procedure the server answers: the method it runs
// and how its reply is built.
type procedure struct {
	name     string
	fn       func(sc *serverConn, payload []byte) (any, error)
	upload   bool // a StorageVolUpload: data streams in after the reply
	download bool // a StorageVolDownload: data streams out after the reply
}

const authNone = libvirt.AuthType(0) // REMOTE_AUTH_NONE

// decodeConnectOpen checks a remote_connect_open_args. Its name is an
// optional string whose presence flag go-libvirt writes as the bytes
// 01 00 00 00, which XDR decoders reading a count reject; libvirtd reads it
// as a bool, where anything but zero is true, and so does this.
func decodeConnectOpen(p []byte) error {
	d := xdr.NewDecoder(bytes.NewReader(p))
	present, _, err := d.DecodeUint()
	if err == nil && present != 0 {
		_, _, err = d.DecodeString()
	}
	if err == nil {
		_, _, err = d.DecodeUint()
	}
	if err != nil {
		return libvirt.Error{Code: uint32(libvirt.ErrRPC), Message: "Unable to decode message payload"}
	}
	return nil
}

// procedures maps libvirt's REMOTE_PROC_* numbers (remote_protocol.x) to
// what the server does for them.
var procedures = map[uint32]procedure{
	66: {name: "AuthList", fn: func(sc *serverConn, _ []byte) (any, error) {
		if err := sc.f.enter("AuthList"); err != nil {
			return nil, err
		}
		defer sc.f.leave("AuthList")
		return libvirt.AuthListRet{Types: []libvirt.AuthType{authNone}}, nil
	}},
	1: {name: "ConnectOpen", fn: func(sc *serverConn, p []byte) (any, error) {
		if err := decodeConnectOpen(p); err != nil {
			return nil, err
		}
		if err := sc.f.enter("ConnectOpen"); err != nil {
			return nil, err
		}
		defer sc.f.leave("ConnectOpen")
		if !sc.opened.CompareAndSwap(false, true) {
			return nil, Errorf(libvirt.ErrInternalError, "connection already open")
		}
		return nil, nil
	}},
	2: {name: "ConnectClose", fn: func(sc *serverConn, _ []byte) (any, error) {
		if err := sc.f.enter("ConnectClose"); err != nil {
			return nil, err
		}
		defer sc.f.leave("ConnectClose")
		sc.opened.Store(false)
		return nil, nil
	}},
	157: {name: "ConnectGetLibVersion", fn: func(sc *serverConn, _ []byte) (any, error) {
		v, err := sc.f.ConnectGetLibVersion()
		return libvirt.ConnectGetLibVersionRet{LibVer: v}, err
	}},
	59: {name: "ConnectGetHostname", fn: func(sc *serverConn, _ []byte) (any, error) {
		h, err := sc.f.ConnectGetHostname()
		return libvirt.ConnectGetHostnameRet{Hostname: h}, err
	}},
	273: {name: "ConnectListAllDomains", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.ConnectListAllDomainsArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		d, n, err := sc.f.ConnectListAllDomains(a.NeedResults, a.Flags)
		return libvirt.ConnectListAllDomainsRet{Domains: d, Ret: n}, err
	}},
	84: {name: "StoragePoolLookupByName", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.StoragePoolLookupByNameArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		pool, err := sc.f.StoragePoolLookupByName(a.Name)
		return libvirt.StoragePoolLookupByNameRet{Pool: pool}, err
	}},
	87: {name: "StoragePoolGetInfo", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.StoragePoolGetInfoArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		s, c, al, av, err := sc.f.StoragePoolGetInfo(a.Pool)
		return libvirt.StoragePoolGetInfoRet{State: s, Capacity: c, Allocation: al, Available: av}, err
	}},
	83: {name: "StoragePoolRefresh", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.StoragePoolRefreshArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		return nil, sc.f.StoragePoolRefresh(a.Pool, a.Flags)
	}},
	95: {name: "StorageVolLookupByName", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.StorageVolLookupByNameArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		v, err := sc.f.StorageVolLookupByName(a.Pool, a.Name)
		return libvirt.StorageVolLookupByNameRet{Vol: v}, err
	}},
	93: {name: "StorageVolCreateXML", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.StorageVolCreateXMLArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		v, err := sc.f.StorageVolCreateXML(a.Pool, a.XML, a.Flags)
		return libvirt.StorageVolCreateXMLRet{Vol: v}, err
	}},
	100: {name: "StorageVolGetPath", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.StorageVolGetPathArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		path, err := sc.f.StorageVolGetPath(a.Vol)
		return libvirt.StorageVolGetPathRet{Name: path}, err
	}},
	98: {name: "StorageVolGetInfo", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.StorageVolGetInfoArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		t, c, al, err := sc.f.StorageVolGetInfo(a.Vol)
		return libvirt.StorageVolGetInfoRet{Type: t, Capacity: c, Allocation: al}, err
	}},
	94: {name: "StorageVolDelete", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.StorageVolDeleteArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		return nil, sc.f.StorageVolDelete(a.Vol, a.Flags)
	}},
	208: {name: "StorageVolUpload", upload: true},
	209: {name: "StorageVolDownload", download: true},
	23: {name: "DomainLookupByName", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainLookupByNameArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		d, err := sc.f.DomainLookupByName(a.Name)
		return libvirt.DomainLookupByNameRet{Dom: d}, err
	}},
	350: {name: "DomainDefineXMLFlags", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainDefineXMLFlagsArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		d, err := sc.f.DomainDefineXMLFlags(a.XML, a.Flags)
		return libvirt.DomainDefineXMLFlagsRet{Dom: d}, err
	}},
	9: {name: "DomainCreate", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainCreateArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		return nil, sc.f.DomainCreate(a.Dom)
	}},
	212: {name: "DomainGetState", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainGetStateArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		s, r, err := sc.f.DomainGetState(a.Dom, a.Flags)
		return libvirt.DomainGetStateRet{State: s, Reason: r}, err
	}},
	265: {name: "DomainGetMetadata", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainGetMetadataArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		m, err := sc.f.DomainGetMetadata(a.Dom, a.Type, a.Uri, a.Flags)
		return libvirt.DomainGetMetadataRet{Metadata: m}, err
	}},
	353: {name: "DomainInterfaceAddresses", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainInterfaceAddressesArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		ifaces, err := sc.f.DomainInterfaceAddresses(a.Dom, a.Source, a.Flags)
		return libvirt.DomainInterfaceAddressesRet{Ifaces: ifaces}, err
	}},
	234: {name: "DomainDestroyFlags", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainDestroyFlagsArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		return nil, sc.f.DomainDestroyFlags(a.Dom, a.Flags)
	}},
	245: {name: "DomainReset", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainResetArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		return nil, sc.f.DomainReset(a.Dom, a.Flags)
	}},
	231: {name: "DomainUndefineFlags", fn: func(sc *serverConn, p []byte) (any, error) {
		var a libvirt.DomainUndefineFlagsArgs
		if err := decodeArgs(p, &a); err != nil {
			return nil, err
		}
		return nil, sc.f.DomainUndefineFlags(a.Dom, a.Flags)
	}},
}
