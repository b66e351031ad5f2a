// Package ident is how kvm2 names and marks its instances: the providerID and the mark in
// a domain's metadata. It imports only the standard library and internal/provider, so
// that its fuzz targets, whose every dependency go test -fuzz compiles instrumented, need
// a small fraction of what the kvm2 package's tests pull in.
package ident

import (
	"strings"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
)

// ProviderID is how an instance is named outside the provider: hosts/<host>/domains/<vm>.
func ProviderID(host, vm string) string { return "hosts/" + host + "/domains/" + vm }

// ParseProviderID splits a providerID into host and domain name. Anything that is not
// exactly hosts/<host>/domains/<vm>, with both parts made of letters, digits, dots,
// dashes and underscores, is permanent: no retry turns it into something valid.
func ParseProviderID(id string) (host, vm string, err error) {
	parts := strings.Split(id, "/")
	if len(parts) != 4 || parts[0] != "hosts" || parts[2] != "domains" {
		return "", "", provider.Errorf(provider.ErrPermanent,
			"malformed providerID %q: want hosts/<host>/domains/<name>", id)
	}
	host, vm = parts[1], parts[3]
	if !ValidName(host) || !ValidName(vm) {
		return "", "", provider.Errorf(provider.ErrPermanent,
			"malformed providerID %q: host and name may hold only letters, digits, dots, dashes and underscores", id)
	}
	return host, vm, nil
}

// ValidName reports whether s is a non-empty run of letters, digits, dots, dashes and
// underscores that is not "." or ".." (so it can never act as a path element).
func ValidName(s string) bool {
	if s == "" || s == "." || s == ".." || len(s) > 200 {
		return false
	}
	for _, r := range s {
		switch {
		case r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z', r >= '0' && r <= '9', r == '.', r == '-', r == '_':
		default:
			return false
		}
	}
	return true
}
