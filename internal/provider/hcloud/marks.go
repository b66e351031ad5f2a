package hcloud

import (
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/hcloud/ident"
)

// The labels that mark a server or firewall as this provider's.
const (
	LabelProvider = "epo-provider"
	LabelInstall  = "epo-install"
	LabelUID      = "epo-uid"
	LabelSpecHash = "epo-spec-hash"
	// LabelServer, on a firewall, names the server it was made for.
	LabelServer = "epo-server"
)

// LabelValue makes s a valid Hetzner label value (see ident.LabelValue).
func LabelValue(s string) string { return ident.LabelValue(s) }

// labels are the marks of a server (or firewall) of Proxy uid built from specHash.
func (p *Provider) labels(uid, specHash string) map[string]string {
	l := map[string]string{LabelProvider: LabelValue(p.name), LabelUID: LabelValue(uid)}
	if p.installID != "" {
		l[LabelInstall] = LabelValue(p.installID)
	}
	if specHash != "" {
		l[LabelSpecHash] = LabelValue(specHash)
	}
	return l
}

// selector is the label selector of this provider entry's and install's resources;
// what it returns is checked again with owner.
func (p *Provider) selector() string {
	s := LabelProvider + "=" + LabelValue(p.name)
	if p.installID != "" {
		s += "," + LabelInstall + "=" + LabelValue(p.installID)
	}
	return s
}

// ownership says whose a server or firewall is.
type ownership int

const (
	ownedHere        ownership = iota // this provider entry and install
	otherInstall                      // this provider's mark, another install's
	notThisProviders                  // no mark of this provider entry at all
)

func (p *Provider) owner(labels map[string]string) ownership {
	if labels[LabelProvider] != LabelValue(p.name) {
		return notThisProviders
	}
	if labels[LabelInstall] != LabelValue(p.installID) {
		return otherInstall
	}
	return ownedHere
}

// ProviderID is hcloud://<name>.
func ProviderID(name string) string { return ident.ProviderID(name) }

// parseProviderID returns the server name of hcloud://<name>; anything else is permanent.
func parseProviderID(id string) (string, error) { return ident.ParseProviderID(id) }
