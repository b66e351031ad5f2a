package kvm2

import (
	"encoding/xml"
	"fmt"
)

// Names of what a VM leaves in the host's pool. The domain itself carries the VM's name;
// the cached base image and its marker are named by imagecache.BaseVolName and
// imagecache.MarkerVolName.

// overlayVolName is the VM's own disk, a qcow2 backed by the base image.
func overlayVolName(vm string) string { return vm + ".qcow2" }

// seedVolName is the VM's NoCloud seed ISO.
func seedVolName(vm string) string { return vm + "-seed.iso" }

// volumeXML is the subset of libvirt's storage volume XML the provider writes.
type volumeXML struct {
	XMLName  xml.Name       `xml:"volume"`
	Name     string         `xml:"name"`
	Capacity volumeCapacity `xml:"capacity"`
	Target   volumeTarget   `xml:"target"`
	Backing  *volumeBacking `xml:"backingStore,omitempty"`
}

type volumeCapacity struct {
	Unit  string `xml:"unit,attr"`
	Value uint64 `xml:",chardata"`
}

type volumeFormat struct {
	Type string `xml:"type,attr"`
}

type volumeTarget struct {
	Format volumeFormat `xml:"format"`
}

type volumeBacking struct {
	Path   string       `xml:"path"`
	Format volumeFormat `xml:"format"`
}

// overlayVolumeXML describes the VM's disk: a qcow2 of capacity bytes whose backing file
// is the base image at basePath (in baseFormat). libvirt creates it thin, with qemu-img.
func overlayVolumeXML(name string, capacity uint64, basePath, baseFormat string) (string, error) {
	return marshalVolume(volumeXML{
		Name:     name,
		Capacity: volumeCapacity{Unit: "bytes", Value: capacity},
		Target:   volumeTarget{Format: volumeFormat{Type: "qcow2"}},
		Backing:  &volumeBacking{Path: basePath, Format: volumeFormat{Type: baseFormat}},
	})
}

// rawVolumeXML describes a raw volume of size bytes (the seed ISO, the image marker).
func rawVolumeXML(name string, size uint64) (string, error) {
	return marshalVolume(volumeXML{
		Name:     name,
		Capacity: volumeCapacity{Unit: "bytes", Value: size},
		Target:   volumeTarget{Format: volumeFormat{Type: "raw"}},
	})
}

func marshalVolume(v volumeXML) (string, error) {
	out, err := xml.MarshalIndent(v, "", "  ")
	if err != nil {
		return "", fmt.Errorf("encoding volume xml for %s: %w", v.Name, err)
	}
	return string(out), nil
}
