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
// libvirt has no labels, so this is how the provider recognises its own domains and
// which Proxy (by UID) each belongs to.
type instanceMeta struct {
	XMLName   xml.Name // {namespace}instance
	Managed   bool     `xml:"managed"`
	UID       string   `xml:"uid"`
	CreatedAt string   `xml:"createdAt"`
}

// marshalMetadata renders the mark in namespace ns, ready for the domain's <metadata>.
func marshalMetadata(ns, uid string, createdAt time.Time) (string, error) {
	m := instanceMeta{
		XMLName:   xml.Name{Space: ns, Local: "instance"},
		Managed:   true,
		UID:       uid,
		CreatedAt: createdAt.UTC().Format(time.RFC3339),
	}
	out, err := xml.Marshal(m)
	if err != nil {
		return "", fmt.Errorf("encoding instance metadata: %w", err)
	}
	return string(out), nil
}

// mark is a parsed mark.
type mark struct {
	UID       string
	CreatedAt time.Time
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
	return mark{UID: strings.TrimSpace(m.UID), CreatedAt: created}, nil
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

// checkAdoption decides whether an existing domain of the requested name may be taken
// over by a repeat Create for uid: it must carry the mark, and the mark's UID must be
// uid or empty. Anything else belongs to someone else and is never touched.
func (p *Provider) checkAdoption(host, name, uid string, m mark, found bool) error {
	if !found {
		return provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s carries no %s mark; it was not created by this provider", name, host, p.typ)
	}
	if m.UID != "" && m.UID != uid {
		return provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s belongs to UID %s, not to UID %s", name, host, m.UID, uid)
	}
	return nil
}
