// Package ident is how the gce provider names and labels its instances: the label values
// it writes and the providerIDs (gce://<project>/<zone>/<name>) it hands out and parses.
// It stands apart from the provider so that its fuzz targets build without the Compute
// client.
package ident

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// LabelValue makes s a valid GCE label value: lowercase letters, digits, '_' and '-', at
// most 63 characters. Other characters become '_'; a longer value keeps its first 46
// characters and a digest of the whole, so distinct inputs stay distinct.
func LabelValue(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		if r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '_' || r == '-' {
			b.WriteRune(r)
		} else {
			b.WriteByte('_')
		}
	}
	v := b.String()
	if len(v) > 63 {
		sum := sha256.Sum256([]byte(s))
		v = v[:46] + "-" + hex.EncodeToString(sum[:8])
	}
	return v
}

// ProviderID is gce://<project>/<zone>/<name>.
func ProviderID(project, zone, name string) string {
	return "gce://" + project + "/" + zone + "/" + name
}

// SplitProviderID splits gce://<project>/<zone>/<name>.
func SplitProviderID(id string) (project, zone, name string, ok bool) {
	rest, ok := strings.CutPrefix(id, "gce://")
	parts := strings.Split(rest, "/")
	if !ok || len(parts) != 3 || parts[0] == "" || parts[1] == "" || parts[2] == "" {
		return "", "", "", false
	}
	return parts[0], parts[1], parts[2], true
}

// ParseProviderID returns the zone and name of a providerID of project; anything else is
// permanent. A well-formed providerID of another project still returns its zone and name.
func ParseProviderID(id, project string) (zone, name string, err error) {
	idProject, zone, name, ok := SplitProviderID(id)
	if !ok {
		return "", "", provider.Errorf(provider.ErrPermanent, "providerID %q is not gce://<project>/<zone>/<name>", id)
	}
	if idProject != project {
		return zone, name, provider.Errorf(provider.ErrPermanent, "providerID %q names project %q, not gce.project %q", id, idProject, project)
	}
	return zone, name, nil
}
