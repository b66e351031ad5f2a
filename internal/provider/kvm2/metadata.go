package kvm2

import (
	"encoding/xml"
	"fmt"
	"strings"
	"time"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// metadataURIBase is the module path's home; each provider type marks its domains in a
// namespace of its own under it, so no type ever lists or adopts another's domains.
const metadataURIBase = "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator"

// metadataURI is the namespace of the kvm2 mark in a domain's <metadata>.
const metadataURI = metadataURIBase + "/" + provider.TypeKVM2

// MetadataURI returns the mark namespace of provider type typ (kvm2, kvm).
func MetadataURI(typ string) string { return metadataURIBase + "/" + typ }

// instanceMeta is the mark: the one element the provider puts in a domain's <metadata>.
// libvirt has no labels, so this is how the provider recognises its own domains, which
// install of the operator made each, which Proxy (by UID) it belongs to and which spec it
// was built from. install and specHash are left out when empty, as marks written before
// they existed lack them; building and removing only appear on a claim (see claim in
// create.go), a domain without disks that holds the name while its owner creates or
// deletes the volumes of that name.
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

// marshalMetadata renders mark m in namespace ns, ready for the domain's <metadata>.
func marshalMetadata(ns string, m mark) (string, error) {
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

// mark is a parsed mark. Install and SpecHash are empty in a mark written before they
// were recorded. Building marks a Create's claim, whose disks are not complete yet;
// Removing a Delete's claim, held while it removes volumes left without a domain.
type mark struct {
	UID       string
	CreatedAt time.Time
	Install   string
	SpecHash  string
	Building  bool
	Removing  bool
}

// parseMetadata reads the element DomainGetMetadata returned for namespace ns. libvirt may
// hand it back with a prefix (<k:instance xmlns:k=...>) or a default namespace; both
// parse. Anything else (not XML, another element or namespace, managed not true, a
// createdAt that is not RFC 3339) is an error the caller reports as corrupt metadata.
func parseMetadata(ns, s string) (mark, error) {
	var m instanceMeta
	if err := xml.Unmarshal([]byte(s), &m); err != nil {
		return mark{}, fmt.Errorf("parsing instance metadata: %w", err)
	}
	// libvirt (9.0 at least) hands the element back without its namespace: the lookup
	// already selected it by ns, so no namespace means ns. Another one is not ours.
	if (m.XMLName.Space != ns && m.XMLName.Space != "") || m.XMLName.Local != "instance" {
		return mark{}, fmt.Errorf("instance metadata is element {%s}%s, want {%s}instance",
			m.XMLName.Space, m.XMLName.Local, ns)
	}
	if !m.Managed {
		return mark{}, fmt.Errorf("instance metadata does not say managed=true")
	}
	var created time.Time
	if ts := strings.TrimSpace(m.CreatedAt); ts != "" {
		t, err := time.Parse(time.RFC3339, ts)
		if err != nil {
			return mark{}, fmt.Errorf("instance metadata createdAt %q: %w", ts, err)
		}
		created = t
	}
	return mark{UID: strings.TrimSpace(m.UID), CreatedAt: created,
		Install: strings.TrimSpace(m.Install), SpecHash: strings.TrimSpace(m.SpecHash),
		Building: m.Building, Removing: m.Removing}, nil
}

// readMark fetches and parses the mark of dom. found is false when the domain carries no
// element in namespace ns; a mark that does not parse is a permanent error, since no
// retry repairs it.
func (p *Provider) readMark(b backend, host string, dom libvirt.Domain) (m mark, found bool, err error) {
	raw, err := b.DomainGetMetadata(dom, int32(libvirt.DomainMetadataElement),
		libvirt.OptString{p.metaNS}, libvirt.DomainAffectCurrent)
	if err != nil {
		if code, ok := libvirtCode(err); ok && code == libvirt.ErrNoDomainMetadata {
			return mark{}, false, nil
		}
		return mark{}, false, err
	}
	m, err = parseMetadata(p.metaNS, raw)
	if err != nil {
		return mark{}, true, provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s has corrupt %s metadata: %w", dom.Name, host, p.typ, err)
	}
	return m, true, nil
}

// otherInstall reports whether mark m was written by another install of the operator:
// it names an install, and not this provider's. A mark naming none was written before
// installs had identities and counts as this install's, so an upgrade keeps adopting and
// collecting its own domains.
func (p *Provider) otherInstall(m mark) bool { return m.Install != "" && m.Install != p.installID }

// otherInstallError is what every path that meets another install's domain reports.
func otherInstallError(class error, host, name string, m mark) error {
	return provider.Errorf(class, "domain %s on host %s belongs to install %s, not to this one", name, host, m.Install)
}

// checkAdoption decides whether an existing domain of the requested name may be taken
// over by a repeat Create for uid: it must carry the mark, written by this install (or
// by none), and the mark's UID must be uid or empty. Anything else belongs to someone
// else and is never touched. A domain of another UID is marked ErrOwnedByOther: once
// orphan GC has removed it, the same Create succeeds.
func (p *Provider) checkAdoption(host, name, uid string, m mark, found bool) error {
	if !found {
		return provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s carries no %s mark; it was not created by this provider", name, host, p.typ)
	}
	if m.Removing {
		// A Delete's claim, whoever's: it goes as soon as the left-over volumes have.
		return provider.Errorf(provider.ErrTransient,
			"domain %s on host %s is a claim held while volumes of that name are removed; trying again", name, host)
	}
	if p.otherInstall(m) {
		return otherInstallError(provider.ErrPermanent, host, name, m)
	}
	if m.UID != "" && m.UID != uid {
		return provider.OwnedByOther(
			fmt.Errorf("domain %s on host %s belongs to UID %s, not to UID %s", name, host, m.UID, uid))
	}
	return nil
}

// builtFromOtherSpec reports whether a mark this Create may adopt records a spec hash
// other than the request's. Either side empty means unknown (a mark from before hashes
// were recorded, a caller that sends none), and unknown is adopted.
func builtFromOtherSpec(m mark, specHash string) bool {
	return m.SpecHash != "" && specHash != "" && m.SpecHash != specHash
}
