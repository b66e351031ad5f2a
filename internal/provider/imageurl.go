package provider

import (
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// RedactURL is raw as messages, logs and spans show it: without userinfo, query string
// and fragment, where credentials and signed tokens live. A raw without any of them comes
// back unchanged, so a value that is no URL at all (an image key) reads as written. One
// that does not parse loses everything from the first '?' or '#' and the userinfo of what
// looks like its authority.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return redactUnparsed(raw)
	}
	if u.User == nil && u.RawQuery == "" && !u.ForceQuery && u.Fragment == "" {
		return raw
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

func redactUnparsed(raw string) string {
	s := raw
	if i := strings.IndexAny(s, "?#"); i >= 0 {
		s = s[:i]
	}
	if i := strings.Index(s, "://"); i >= 0 {
		rest := s[i+3:]
		end := strings.IndexByte(rest, '/')
		if end < 0 {
			end = len(rest)
		}
		if at := strings.LastIndexByte(rest[:end], '@'); at >= 0 {
			s = s[:i+3] + rest[at+1:]
		}
	}
	return s
}

// ImageURLPrefix is one entry of allowedImageURLPrefixes: a scheme, a host (with its
// port made explicit) and a path the URLs under it start with.
type ImageURLPrefix struct {
	scheme, host, path string
}

// ParseImageURLPrefix reads one allowedImageURLPrefixes entry: an http or https URL with
// a host, without userinfo, query or fragment, and without . or .. path segments.
func ParseImageURLPrefix(s string) (ImageURLPrefix, error) {
	u, err := url.Parse(s)
	if err != nil {
		// The url.Error would repeat the value, which may carry credentials.
		return ImageURLPrefix{}, errors.New("is not a valid URL")
	}
	shown := RedactURL(s)
	switch {
	case (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "":
		return ImageURLPrefix{}, fmt.Errorf("%q must be an http or https URL with a host", shown)
	case u.User != nil || u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return ImageURLPrefix{}, fmt.Errorf("%q must not carry userinfo, a query or a fragment", shown)
	case hasDotSegment(u.Path):
		return ImageURLPrefix{}, fmt.Errorf("%q must not have . or .. path segments", shown)
	}
	return ImageURLPrefix{scheme: u.Scheme, host: hostPort(u), path: u.Path}, nil
}

// Matches reports whether u lies under the prefix: the same scheme, the same host and
// port (a missing port is the scheme's default), and a path that is the prefix's path or
// continues it after a '/'. A prefix path ending in '/' matches only paths below it. u's
// userinfo plays no part. A URL whose path has . or .. segments matches no prefix: the
// server would resolve them to a path outside it.
func (p ImageURLPrefix) Matches(u *url.URL) bool {
	if !strings.EqualFold(u.Scheme, p.scheme) || hostPort(u) != p.host || hasDotSegment(u.Path) {
		return false
	}
	switch {
	case p.path == "" || p.path == "/":
		return true
	case strings.HasSuffix(p.path, "/"):
		return strings.HasPrefix(u.Path, p.path)
	}
	return u.Path == p.path || strings.HasPrefix(u.Path, p.path+"/")
}

// hostPort is u's host in lower case with the port made explicit.
func hostPort(u *url.URL) string {
	port := u.Port()
	if port == "" {
		port = map[string]string{"http": "80", "https": "443"}[strings.ToLower(u.Scheme)]
	}
	return strings.ToLower(u.Hostname()) + ":" + port
}

// hasDotSegment reports whether the (decoded) path has a "." or ".." segment.
func hasDotSegment(p string) bool {
	for seg := range strings.SplitSeq(p, "/") {
		if seg == "." || seg == ".." {
			return true
		}
	}
	return false
}
