package ident

import (
	"encoding/xml"
	"fmt"
	"strings"
	"time"
)

// instanceMeta is the mark as XML: the one element the provider puts in a domain's
// <metadata>. libvirt has no labels, so this is how the provider recognises its own
// domains, which install of the operator made each, which Proxy (by UID) it belongs to and
// which spec it was built from. Install and SpecHash are left out when empty, as marks
// written before they existed lack them; Building and Removing only appear on a claim (see
// claim in kvm2's create.go), a domain without disks that holds the name while its owner
// creates or deletes the volumes of that name.
type instanceMeta struct {
	XMLName   xml.Name // {namespace}instance
	Managed   bool     `xml:"managed"`
	UID       string   `xml:"uid"`
	CreatedAt string   `xml:"createdAt"`
	Install   string   `xml:"install,omitempty"`
	SpecHash  string   `xml:"specHash,omitempty"`
	Building  bool     `xml:"building,omitempty"`
	Removing  bool     `xml:"removing,omitempty"`
}

// MarshalMark renders mark m in namespace ns, ready for the domain's <metadata>.
func MarshalMark(ns string, m Mark) (string, error) {
	meta := instanceMeta{
		XMLName:   xml.Name{Space: ns, Local: "instance"},
		Managed:   true,
		UID:       m.UID,
		CreatedAt: m.CreatedAt.UTC().Format(time.RFC3339),
		Install:   m.Install,
		SpecHash:  m.SpecHash,
		Building:  m.Building,
		Removing:  m.Removing,
	}
	out, err := xml.Marshal(meta)
	if err != nil {
		return "", fmt.Errorf("encoding instance metadata: %w", err)
	}
	return string(out), nil
}

// Mark is a parsed mark. Install and SpecHash are empty in a mark written before they
// were recorded. Building marks a Create's claim, whose disks are not complete yet;
// Removing a Delete's claim, held while it removes volumes left without a domain.
type Mark struct {
	UID       string
	CreatedAt time.Time
	Install   string
	SpecHash  string
	Building  bool
	Removing  bool
}

// ParseMark reads the element DomainGetMetadata returned for namespace ns. libvirt may
// hand it back with a prefix (<k:instance xmlns:k=...>) or a default namespace; both
// parse. Anything else (not XML, another element or namespace, managed not true, a
// createdAt that is not RFC 3339) is an error the caller reports as corrupt metadata.
func ParseMark(ns, s string) (Mark, error) {
	var m instanceMeta
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return Mark{}, fmt.Errorf("parsing instance metadata: %w", err)
	}
	// libvirt (9.0 at least) hands the element back without its namespace: the lookup
	// already selected it by ns, so no namespace means ns. Another one is not ours.
	if (m.XMLName.Space != ns && m.XMLName.Space != "") || m.XMLName.Local != "instance" {
		return Mark{}, fmt.Errorf("instance metadata is element {%s}%s, want {%s}instance",
			m.XMLName.Space, m.XMLName.Local, ns)
	}
	if !m.Managed {
		return Mark{}, fmt.Errorf("instance metadata does not say managed=true")
	}
	var created time.Time
	if ts := strings.TrimSpace(m.CreatedAt); ts != "" {
		t, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			return Mark{}, fmt.Errorf("instance metadata createdAt %q: %w", ts, err)
		}
		created = t
	}
	return Mark{UID: strings.TrimSpace(m.UID), CreatedAt: created,
		Install: strings.TrimSpace(m.Install), SpecHash: strings.TrimSpace(m.SpecHash),
		Building: m.Building, Removing: m.Removing}, nil
}
