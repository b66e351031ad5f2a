package imagecache

import (
	"strings"
	"testing"
)

func TestWithoutURL(t *testing.T) {
	raw := "https://op:s3cret@mirror.example:8443/img/debian.qcow2?sig=abc"
	for _, msg := range []string{
		"image URL " + raw + " answered 404 Not Found",
		"image URL " + urlForUsers(raw) + " answered 404 Not Found",
		`Get "https://op:***@mirror.example:8443/img/debian.qcow2?sig=abc": EOF`,
	} {
		got := withoutURL(msg, raw)
		if strings.Contains(got, "/img/") || strings.Contains(got, "s3cret") || !strings.Contains(got, "mirror.example:8443") {
			t.Errorf("withoutURL(%q) = %q", msg, got)
		}
	}
	if strings.Contains(urlForUsers(raw), "s3cret") {
		t.Errorf("urlForUsers keeps the password: %s", urlForUsers(raw))
	}
}
