package hcloud

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
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

// labelValueRE is Hetzner's rule for a label value: empty, or at most 63 characters of
// letters, digits, '-', '_' and '.', starting and ending with a letter or digit.
var labelValueRE = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)

// LabelValue makes s a valid Hetzner label value. A valid s is kept as it is (a
// Kubernetes UID, an entry's name); any other becomes its first characters with the
// others replaced by '_', then '-' and a digest of the whole, so distinct inputs stay
// distinct.
func LabelValue(s string) string {
	if labelValueRE.MatchString(s) {
		return s
	}
	var b strings.Builder
	b.WriteString("x")
	for _, r := range s {
		if b.Len() >= 46 {
			break
		}
		if r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	sum := sha256.Sum256([]byte(s))
	return b.String() + "-" + hex.EncodeToString(sum[:8])
}

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

// providerIDPrefix starts every providerID: hcloud://<server name>. Server names are
// unique in a project, and the name survives a replacement, which the server's ID does
// not.
const providerIDPrefix = "hcloud://"

// ProviderID is hcloud://<name>.
func ProviderID(name string) string { return providerIDPrefix + name }

// nameRE is the rule for a server name the provider makes (a hostname label).
var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// parseProviderID returns the server name of hcloud://<name>; anything else is permanent.
func parseProviderID(id string) (string, error) {
	name, ok := strings.CutPrefix(id, providerIDPrefix)
	if !ok || !nameRE.MatchString(name) {
		return "", provider.Errorf(provider.ErrPermanent, "providerID %q is not hcloud://<server name>", id)
	}
	return name, nil
}
