package kvm2

import (
	"fmt"

	"github.com/digitalocean/go-libvirt"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2/ident"
)

// metadataURIBase is the module path's home; each provider type marks its domains in a
// namespace of its own under it, so no type ever lists or adopts another's domains.
const metadataURIBase = "https://gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator"

// metadataURI is the namespace of the kvm2 mark in a domain's <metadata>.
const metadataURI = metadataURIBase + "/" + provider.TypeKVM2

// MetadataURI returns the mark namespace of provider type typ (kvm2, kvm).
func MetadataURI(typ string) string { return metadataURIBase + "/" + typ }

// readMark fetches and parses the mark of dom. found is false when the domain carries no
// element in namespace ns; a mark that does not parse is a permanent error, since no
// retry repairs it.
func (p *Provider) readMark(b backend, host string, dom libvirt.Domain) (m ident.Mark, found bool, err error) {
	raw, err := b.DomainGetMetadata(dom, int32(libvirt.DomainMetadataElement),
		libvirt.OptString{p.metaNS}, libvirt.DomainAffectCurrent)
	if err != nil {
		if code, ok := libvirtCode(err); ok && code == libvirt.ErrNoDomainMetadata {
			return ident.Mark{}, false, nil
		}
		return ident.Mark{}, false, err
	}
	m, err = ident.ParseMark(p.metaNS, raw)
	if err != nil {
		return ident.Mark{}, true, provider.Errorf(provider.ErrPermanent,
			"domain %s on host %s has corrupt %s metadata: %w", dom.Name, host, p.typ, err)
	}
	return m, true, nil
}

// otherInstall reports whether mark m was written by another install of the operator:
// it names an install, and not this provider's. A mark naming none was written before
// installs had identities and counts as this install's, so an upgrade keeps adopting and
// collecting its own domains.
func (p *Provider) otherInstall(m ident.Mark) bool {
	return m.Install != "" && m.Install != p.installID
}

// otherInstallError is what every path that meets another install's domain reports.
func otherInstallError(class error, host, name string, m ident.Mark) error {
	return provider.Errorf(class, "domain %s on host %s belongs to install %s, not to this one", name, host, m.Install)
}

// checkAdoption decides whether an existing domain of the requested name may be taken
// over by a repeat Create for uid: it must carry the ident.Mark, written by this install (or
// by none), and the mark's UID must be uid or empty. Anything else belongs to someone
// else and is never touched. A domain of another UID is marked ErrOwnedByOther: once
// orphan GC has removed it, the same Create succeeds.
func (p *Provider) checkAdoption(host, name, uid string, m ident.Mark, found bool) error {
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
func builtFromOtherSpec(m ident.Mark, specHash string) bool {
	return m.SpecHash != "" && specHash != "" && m.SpecHash != specHash
}
