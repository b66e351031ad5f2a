package hcloudfake

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
)

// The label syntax of the API reference (Labels), as hcloud-go's labels.go checks it
// too: a key is an optional DNS-subdomain prefix and "/" and a name of at most 63
// characters, alphanumeric at both ends with - _ . inside; a value is empty or at most 63
// such characters.
var (
	labelKeyRE   = regexp.MustCompile(`^([a-z0-9A-Z]((?:[\-_.]|[a-z0-9A-Z]){0,253}[a-z0-9A-Z])?/)?[a-z0-9A-Z]((?:[\-_.]|[a-z0-9A-Z]|){0,61}[a-z0-9A-Z])?$`)
	labelValueRE = regexp.MustCompile(`^(([a-z0-9A-Z](?:[\-_.]|[a-z0-9A-Z]){0,61})?[a-z0-9A-Z]$|$)`)
)

// checkLabels answers invalid_input naming the label when one breaks the syntax.
func checkLabels(w http.ResponseWriter, labels map[string]string) bool {
	for _, k := range sortedKeys(labels) {
		if !labelKeyRE.MatchString(k) {
			invalidInput(w, "labels", fmt.Sprintf("label key '%s' is not correctly formatted", k))
			return false
		}
		if !labelValueRE.MatchString(labels[k]) {
			invalidInput(w, "labels", fmt.Sprintf("label value '%s' (key: %s) is not correctly formatted", labels[k], k))
			return false
		}
	}
	return true
}

// selector is a parsed label selector: every requirement must hold.
type selector []func(map[string]string) bool

func (sel selector) matches(labels map[string]string) bool {
	for _, f := range sel {
		if !f(labels) {
			return false
		}
	}
	return true
}

var setExprRE = regexp.MustCompile(`^(\S+)\s+(in|notin)\s+\((.*)\)$`)

// parseSelector reads the label-selector grammar of the API reference: requirements
// joined by commas, each one of k=v or k==v (equal), k!=v (not equal, or no such key),
// k (the key exists), !k (it does not), k in (v1,v2) and k notin (v1,v2) (no such key
// also matches notin). An empty selector selects everything.
func parseSelector(raw string) (selector, error) {
	var sel selector
	if strings.TrimSpace(raw) == "" {
		return sel, nil
	}
	var terms []string
	depth, start := 0, 0
	for i, c := range raw {
		switch c {
		case '(':
			depth++
		case ')':
			depth--
			if depth < 0 {
				return nil, fmt.Errorf("unbalanced ')' at %d", i)
			}
		case ',':
			if depth == 0 {
				terms = append(terms, raw[start:i])
				start = i + 1
			}
		}
	}
	if depth != 0 {
		return nil, fmt.Errorf("unbalanced '('")
	}
	terms = append(terms, raw[start:])
	key := func(k string) (string, error) {
		k = strings.TrimSpace(k)
		if !labelKeyRE.MatchString(k) {
			return "", fmt.Errorf("invalid label key %q", k)
		}
		return k, nil
	}
	value := func(v string) (string, error) {
		v = strings.TrimSpace(v)
		if !labelValueRE.MatchString(v) {
			return "", fmt.Errorf("invalid label value %q", v)
		}
		return v, nil
	}
	for _, t := range terms {
		t = strings.TrimSpace(t)
		if t == "" {
			return nil, fmt.Errorf("empty requirement")
		}
		if m := setExprRE.FindStringSubmatch(t); m != nil {
			k, err := key(m[1])
			if err != nil {
				return nil, err
			}
			var vals []string
			for _, v := range strings.Split(m[3], ",") {
				v, err := value(v)
				if err != nil {
					return nil, err
				}
				vals = append(vals, v)
			}
			if m[2] == "in" {
				sel = append(sel, func(l map[string]string) bool { v, ok := l[k]; return ok && slices.Contains(vals, v) })
			} else {
				sel = append(sel, func(l map[string]string) bool { v, ok := l[k]; return !ok || !slices.Contains(vals, v) })
			}
			continue
		}
		var op string
		for _, o := range []string{"!=", "==", "="} {
			if strings.Contains(t, o) {
				op = o
				break
			}
		}
		if op == "" {
			neg := strings.HasPrefix(t, "!")
			k, err := key(strings.TrimPrefix(t, "!"))
			if err != nil {
				return nil, err
			}
			sel = append(sel, func(l map[string]string) bool { _, ok := l[k]; return ok != neg })
			continue
		}
		kRaw, vRaw, _ := strings.Cut(t, op)
		k, err := key(kRaw)
		if err != nil {
			return nil, err
		}
		v, err := value(vRaw)
		if err != nil {
			return nil, err
		}
		if op == "!=" {
			sel = append(sel, func(l map[string]string) bool { got, ok := l[k]; return !ok || got != v })
		} else {
			sel = append(sel, func(l map[string]string) bool { got, ok := l[k]; return ok && got == v })
		}
	}
	return sel, nil
}

// selectorOf reads the request's label_selector, answering invalid_input when it
// cannot be parsed.
func selectorOf(w http.ResponseWriter, r *http.Request) (selector, bool) {
	sel, err := parseSelector(r.URL.Query().Get("label_selector"))
	if err != nil {
		invalidInput(w, "label_selector", err.Error())
		return nil, false
	}
	return sel, true
}

// hostnameLabelRE is one label of an RFC 1123 host name.
var hostnameLabelRE = regexp.MustCompile(`^[a-zA-Z0-9]([a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?$`)

// validHostname says whether name is a host name as RFC 1123 has it (labels of 1 to 63
// letters, digits and inner hyphens, 253 characters at most), which the API demands of
// a server's name.
func validHostname(name string) bool {
	if name == "" || len(name) > 253 {
		return false
	}
	for _, l := range strings.Split(name, ".") {
		if !hostnameLabelRE.MatchString(l) {
			return false
		}
	}
	return true
}

func copyLabels(l map[string]string) map[string]string {
	out := make(map[string]string, len(l))
	for k, v := range l {
		out[k] = v
	}
	return out
}
