// Package ident is how the hcloud provider names and labels its servers and firewalls: the
// label values it writes and the providerIDs (hcloud://<server name>) it hands out and
// parses. It stands apart from the provider so that its fuzz targets build without the
// Hetzner Cloud client.
package ident

import (
	"crypto/sha256"
	"encoding/hex"
	"regexp"
	"strings"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// labelValueRE is Hetzner's rule for a label value: empty, or at most 63 characters of
// letters, digits, '-', '_' and '.', starting and ending with a letter or digit.
var labelValueRE = regexp.MustCompile(`^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$`)

// ValidLabelValue says whether s is a label value Hetzner takes.
func ValidLabelValue(s string) bool { return labelValueRE.MatchString(s) }

// LabelValue makes s a valid Hetzner label value. A valid s is kept as it is (a
// Kubernetes UID, an entry's name of up to 63 characters); any other becomes "x", its
// first characters with the others replaced by '_', then '-' and a digest of the whole,
// so distinct inputs stay distinct.
func LabelValue(s string) string {
	if ValidLabelValue(s) {
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

// prefix starts every providerID: hcloud://<server name>. Server names are unique in a
// project, and the name survives a replacement, which the server's ID does not.
const prefix = "hcloud://"

// ProviderID is hcloud://<name>.
func ProviderID(name string) string { return prefix + name }

// nameRE is the rule for a server name the provider makes (a hostname label).
var nameRE = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$`)

// ValidName says whether name is a server name the provider makes or reads.
func ValidName(name string) bool { return nameRE.MatchString(name) }

// ParseProviderID returns the server name of hcloud://<name>; anything else is permanent.
func ParseProviderID(id string) (string, error) {
	name, ok := strings.CutPrefix(id, prefix)
	if !ok || !ValidName(name) {
		return "", provider.Errorf(provider.ErrPermanent, "providerID %q is not hcloud://<server name>", id)
	}
	return name, nil
}
