package proxyconfig

import (
	"strings"
	"testing"
	"time"
)

func TestSpecHashInput(t *testing.T) {
	base, err := SpecHashInput(sampleConfig(), userDocs["cloud-config"])
	if err != nil {
		t.Fatal(err)
	}
	if again, _ := SpecHashInput(sampleConfig(), userDocs["cloud-config"]); again != base {
		t.Error("the same inputs give two hash inputs")
	}
	if strings.Contains(base, sampleConfig().Credentials.Password) {
		t.Errorf("the hash input holds the password in clear:\n%s", base)
	}
	for name, mutate := range map[string]func(*Config, *string){
		"a range added":    func(c *Config, _ *string) { c.AllowedSourceRanges = append(c.AllowedSourceRanges, "172.16.0.0/12") },
		"a range removed":  func(c *Config, _ *string) { c.AllowedSourceRanges = c.AllowedSourceRanges[1:] },
		"password rotated": func(c *Config, _ *string) { c.Credentials = &Credentials{Username: "crawler", Password: "Xk9-q.Tr_23"} },
		"username changed": func(c *Config, _ *string) {
			c.Credentials = &Credentials{Username: "crawler2", Password: "Xk9-q.Tr_22"}
		},
		"auth turned off":     func(c *Config, _ *string) { c.Credentials = nil },
		"port changed":        func(c *Config, _ *string) { c.Port = 8888 },
		"user cloud-init":     func(_ *Config, u *string) { *u += "timezone: UTC\n" },
		"user cloud-init off": func(_ *Config, u *string) { *u = "" },
	} {
		c, user := sampleConfig(), userDocs["cloud-config"]
		mutate(&c, &user)
		got, err := SpecHashInput(c, user)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if got == base {
			t.Errorf("%s: the hash input did not change, so the instance would not be replaced", name)
		}
	}
}

func TestSpecHashInputWithoutAuthIsTheUserData(t *testing.T) {
	c := sampleConfig()
	c.Credentials = nil
	in, err := SpecHashInput(c, userDocs["shellscript"])
	if err != nil {
		t.Fatal(err)
	}
	doc, _ := UserData(c, userDocs["shellscript"])
	if in != string(doc) {
		t.Errorf("without credentials the hash input is not the user-data itself")
	}
}

// The digest is slow once and then cached, so a reconcile of many Proxies sharing one
// Secret pays it once.
func TestPasswordDigestCached(t *testing.T) {
	c := Credentials{Username: "cache-test", Password: "p-" + time.Now().Format("150405.000000")}
	start := time.Now()
	d1, err := passwordDigest(c)
	if err != nil {
		t.Fatal(err)
	}
	first := time.Since(start)
	start = time.Now()
	d2, _ := passwordDigest(c)
	second := time.Since(start)
	if d1 != d2 || len(d1) != 2*digestLen {
		t.Fatalf("digests %q and %q", d1, d2)
	}
	if second > first {
		t.Errorf("the cached digest took %v, the first %v", second, first)
	}
	t.Logf("digest: first %v, cached %v", first, second)
}
