package main

import (
	"bytes"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// The command prints exactly what the operator renders, with the user's cloud-init
// combined, and says which input it could not use.
func TestRender(t *testing.T) {
	c := proxyconfig.Config{Port: 3128, AllowedSourceRanges: []string{"10.123.0.0/24"},
		AllowedDestinations: []string{"10.123.0.1/32"}, Credentials: &proxyconfig.Credentials{Username: "smoke", Password: "s3cret"}}
	user := "#cloud-config\nbootcmd:\n  - [true]\n"
	want, err := proxyconfig.UserData(c, user)
	if err != nil {
		t.Fatal(err)
	}
	var out bytes.Buffer
	in := `{"config": {"Port": 3128, "AllowedSourceRanges": ["10.123.0.0/24"], "AllowedDestinations": ["10.123.0.1/32"],
	  "Credentials": {"Username": "smoke", "Password": "s3cret"}}, "cloudInit": "#cloud-config\nbootcmd:\n  - [true]\n"}`
	if err := render(strings.NewReader(in), &out); err != nil {
		t.Fatal(err)
	}
	if out.String() != string(want) {
		t.Errorf("printed:\n%s\nwant proxyconfig.UserData's:\n%s", out.String(), want)
	}

	for _, tc := range []struct{ in, want string }{
		{`{"config": `, "reading the configuration (JSON on stdin)"},
		{`{"config": {"Port": 3128}}`, "rendering: " + proxyconfig.ErrNoSourceRanges.Error()},
	} {
		err := render(strings.NewReader(tc.in), &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("input %q: error %v, want one saying %q", tc.in, err, tc.want)
		}
	}
}
