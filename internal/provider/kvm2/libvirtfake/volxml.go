package libvirtfake

import (
	"bytes"
	"encoding/binary"
	"encoding/xml"
	"strconv"
	"strings"

	"github.com/digitalocean/go-libvirt"
)

type volSize struct {
	Unit  string `xml:"unit,attr"`
	Value string `xml:",chardata"`
}

type volumeXML struct {
	XMLName    xml.Name `xml:"volume"`
	Name       string   `xml:"name"`
	Capacity   *volSize `xml:"capacity"`
	Allocation *volSize `xml:"allocation"`
	Target     struct {
		Format struct {
			Type string `xml:"type,attr"`
		} `xml:"format"`
	} `xml:"target"`
	BackingStore *struct {
		Path   string `xml:"path"`
		Format struct {
			Type string `xml:"type,attr"`
		} `xml:"format"`
	} `xml:"backingStore"`
}

// unitScale is libvirt's virScaleInteger: binary and decimal suffixes.
var unitScale = map[string]uint64{
	"": 1, "b": 1, "bytes": 1,
	"k": 1 << 10, "kib": 1 << 10, "kb": 1e3,
	"m": 1 << 20, "mib": 1 << 20, "mb": 1e6,
	"g": 1 << 30, "gib": 1 << 30, "gb": 1e9,
	"t": 1 << 40, "tib": 1 << 40, "tb": 1e12,
}

func (s *volSize) bytes(elem string) (uint64, error) {
	n, err := strconv.ParseUint(strings.TrimSpace(s.Value), 10, 64)
	if err != nil {
		return 0, Errorf(libvirt.ErrXMLError, "malformed %s element", elem)
	}
	scale, ok := unitScale[strings.ToLower(s.Unit)]
	if !ok {
		return 0, Errorf(libvirt.ErrInvalidArg, "unknown suffix '%s'", s.Unit)
	}
	return n * scale, nil
}

// parseVolumeXML reads a <volume> definition: name, capacity and allocation
// with units, target format (raw when absent) and backingStore path and
// format. A raw volume without <allocation> is fully allocated, as libvirt
// creates it; every other format starts thin.
func parseVolumeXML(doc string) (*volume, error) {
	var x volumeXML
	if err := xml.Unmarshal([]byte(doc), &x); err != nil {
		return nil, Errorf(libvirt.ErrXMLError, "%s", err.Error())
	}
	if x.Name == "" {
		return nil, libvirt.Error{Code: uint32(libvirt.ErrNoName), Message: "missing volume name element"}
	}
	if strings.Contains(x.Name, "/") {
		return nil, Errorf(libvirt.ErrInvalidArg, "volume name '%s' cannot contain '/'", x.Name)
	}
	v := &volume{name: x.Name, xml: doc, format: x.Target.Format.Type}
	if v.format == "" {
		v.format = "raw"
	}
	if x.BackingStore != nil {
		v.backing = x.BackingStore.Path
		v.backingFmt = x.BackingStore.Format.Type
	}
	switch {
	case x.Capacity != nil:
		c, err := x.Capacity.bytes("capacity")
		if err != nil {
			return nil, err
		}
		v.capacity = c
	case v.backing == "":
		return nil, Errorf(libvirt.ErrXMLError, "missing capacity element")
	}
	switch {
	case x.Allocation != nil:
		a, err := x.Allocation.bytes("allocation")
		if err != nil {
			return nil, err
		}
		v.allocation = a
	case v.format == "raw":
		v.allocation = v.capacity
	}
	return v, nil
}

var qcow2Magic = []byte{'Q', 'F', 'I', 0xfb}

// Qcow2 returns n bytes (at least 104) that start with the header of a
// version-3 qcow2 image of the given virtual size: enough for
// StoragePoolRefresh's probe and for tests that serve "an image" over HTTP,
// though not an image qemu could open.
func Qcow2(virtualSize uint64, n int) []byte {
	b := make([]byte, max(n, 104))
	copy(b, qcow2Magic)
	binary.BigEndian.PutUint32(b[4:], 3)   // version
	binary.BigEndian.PutUint32(b[20:], 16) // cluster bits: 64 KiB clusters
	binary.BigEndian.PutUint64(b[24:], virtualSize)
	binary.BigEndian.PutUint32(b[96:], 4)    // refcount order: 16-bit refcounts
	binary.BigEndian.PutUint32(b[100:], 104) // header length
	return b
}

// probe updates format and capacity from the content, as a dir pool's
// refresh does: qcow2 content (its magic) is qcow2 with the virtual size from
// its header, anything else is raw with the file's size.
func (v *volume) probe() {
	if len(v.content) >= 32 && bytes.Equal(v.content[:4], qcow2Magic) {
		v.format = "qcow2"
		v.capacity = binary.BigEndian.Uint64(v.content[24:32])
		return
	}
	if v.format == "qcow2" && len(v.content) == 0 {
		return // created by qemu-img and never written: keep what it reports
	}
	v.format = "raw"
	if size := uint64(len(v.content)); size > v.capacity {
		v.capacity = size
	}
}
