package provider

import (
	"net/url"
	"testing"

	"sigs.k8s.io/yaml"
)

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://op:s3cret@mirror.example:8443/img/debian.qcow2?sig=abc#frag": "https://mirror.example:8443/img/debian.qcow2",
		"https://op@mirror.example/img.qcow2":                                 "https://mirror.example/img.qcow2",
		"https://mirror.example/img.qcow2?":                                   "https://mirror.example/img.qcow2",
		"https://mirror.example/img.qcow2?X-Amz-Signature=t0ken&b=c":          "https://mirror.example/img.qcow2",
		// Nothing to strip: unchanged, byte for byte, URL or not.
		"https://mirror.example/a%20b.qcow2": "https://mirror.example/a%20b.qcow2",
		"debian-13":                          "debian-13",
		"https://":                           "https://",
		// Does not parse (bad escape): cut at '?', userinfo of the authority dropped.
		"https://op:s3cret@mirror.example/%zz?sig=abc": "https://mirror.example/%zz",
		"http://u:p@h%zz": "http://h%zz",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestImageURLPrefixMatches(t *testing.T) {
	for _, tc := range []struct {
		prefix string
		yes    []string
		no     []string
	}{
		{prefix: "https://images.example.com/cloud/",
			yes: []string{"https://images.example.com/cloud/debian.qcow2", "HTTPS://Images.Example.COM:443/cloud/a/b.img",
				"https://user:pw@images.example.com/cloud/x?sig=1"},
			no: []string{"https://images.example.com/cloud", "https://images.example.com/cloudy/x", "http://images.example.com/cloud/x",
				"https://images.example.com:8443/cloud/x", "https://images.example.com.evil.net/cloud/x",
				"https://images.example.com@evil.net/cloud/x", "https://images.example.com/cloud/../secret",
				"https://images.example.com/cloud/%2e%2e/secret", "https://images.example.com/cloud/./x", "https://evil.net/cloud/x"}},
		{prefix: "https://images.example.com/cloud",
			yes: []string{"https://images.example.com/cloud", "https://images.example.com/cloud/x.img"},
			no:  []string{"https://images.example.com/cloud-evil/x.img", "https://images.example.com/clou"}},
		{prefix: "http://10.0.0.5:8080",
			yes: []string{"http://10.0.0.5:8080/x.img", "http://10.0.0.5:8080"},
			no:  []string{"http://10.0.0.5/x.img", "http://10.0.0.50:8080/x.img", "http://10.0.0.5:80801/x"}},
		{prefix: "http://mirror.lan/",
			yes: []string{"http://mirror.lan:80/x.img", "http://MIRROR.lan/"},
			no:  []string{"https://mirror.lan/x.img", "http://mirror.lan:8080/x.img"}},
		{prefix: "http://[fd00::5]:8080/img/",
			yes: []string{"http://[FD00::5]:8080/img/a"},
			no:  []string{"http://[fd00::5]/img/a", "http://fd00::5:8080/img/a"}},
	} {
		pre, err := ParseImageURLPrefix(tc.prefix)
		if err != nil {
			t.Fatalf("prefix %q: %v", tc.prefix, err)
		}
		for _, raw := range tc.yes {
			if u, err := url.Parse(raw); err != nil || !pre.Matches(u) {
				t.Errorf("prefix %q does not match %q (%v)", tc.prefix, raw, err)
			}
		}
		for _, raw := range tc.no {
			if u, err := url.Parse(raw); err == nil && pre.Matches(u) {
				t.Errorf("prefix %q matches %q", tc.prefix, raw)
			}
		}
	}
}

// Absent and empty mean different things (any URL, checked by address; no URL at all), so
// both the parser and WithDefaults keep them apart.
func TestKVMConfigAllowedImageURLPrefixesAbsentVersusEmpty(t *testing.T) {
	doc := func(line string) []byte {
		return []byte(`providers:
- name: home
  type: kvm2
  kvm2:
    sshKeyFile: /k
    insecureIgnoreHostKey: true
` + line + `
    machineTypes: {small: {vcpus: 1, memoryMiB: 512}}
    hosts: [{name: h, address: 'h:22', user: u, bridge: br0}]
`)
	}
	for _, tc := range []struct {
		line   string
		listed bool
		n      int
	}{
		{line: "", listed: false},
		{line: "    allowedImageURLPrefixes:", listed: false},
		{line: "    allowedImageURLPrefixes: []", listed: true},
		{line: "    allowedImageURLPrefixes: ['http://mirror.lan/']", listed: true, n: 1},
	} {
		cfg, err := ParseConfig(doc(tc.line))
		if err != nil {
			t.Fatalf("%q: %v", tc.line, err)
		}
		for _, k := range []KVMConfig{*cfg.Providers[0].KVM2, cfg.Providers[0].KVM2.WithDefaults()} {
			if got := k.AllowedImageURLPrefixes != nil; got != tc.listed || len(k.ImageURLPrefixes()) != tc.n {
				t.Errorf("%q: listed %v with %d entries, want %v with %d", tc.line, got, len(k.ImageURLPrefixes()), tc.listed, tc.n)
			}
		}
		// Marshalled and parsed again (what a round trip through a ConfigMap does), the
		// difference survives.
		out, _ := yaml.Marshal(cfg)
		again, err := ParseConfig(out)
		if err != nil || (again.Providers[0].KVM2.AllowedImageURLPrefixes != nil) != tc.listed {
			t.Errorf("%q: round trip lost the setting: %v\n%s", tc.line, err, out)
		}
	}
	// WithDefaults copies the list.
	in := KVMConfig{AllowedImageURLPrefixes: &[]string{"http://a/"}}
	out := in.WithDefaults()
	(*out.AllowedImageURLPrefixes)[0] = "http://changed/"
	if (*in.AllowedImageURLPrefixes)[0] != "http://a/" {
		t.Fatal("WithDefaults shares the prefix list with its input")
	}
}
