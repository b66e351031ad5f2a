package proxyconfig

import (
	"errors"
	"io"
	"mime"
	"mime/multipart"
	"net/mail"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testutil"
)

func sampleConfig() Config {
	return Config{
		Port:                3128,
		AllowedSourceRanges: []string{"10.0.0.0/8", "192.168.1.0/24", "2001:db8::/32"},
		Credentials:         &Credentials{Username: "crawler", Password: "Xk9-q.Tr_22"},
	}
}

func TestCloudConfigGolden(t *testing.T) {
	noAuth := sampleConfig()
	noAuth.Credentials = nil
	noAuth.Port = 8888
	noAuth.AllowedDestinations = []string{"10.123.0.2/32", "fd00:1::/64"}
	for name, c := range map[string]Config{
		"cloud-config-basic-auth.golden": sampleConfig(),
		"cloud-config-no-auth.golden":    noAuth,
	} {
		got, err := CloudConfig(c)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		testutil.Golden(t, name, got)
	}
}

// The rendered document is YAML cloud-init reads as meant: the drop-in, the retry unit
// and a reload in bootcmd, tinyproxy's configuration, the fence's ruleset and script in write_files, and
// in runcmd only the installs of what is missing and a start that does nothing when
// tinyproxy runs already (no restart: one start, behind the fence).
func TestCloudConfigIsTheIntendedYAML(t *testing.T) {
	c := sampleConfig()
	c.AllowedDestinations = []string{"10.123.0.7/24", "fd00:1::/64"}
	doc, err := CloudConfig(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(string(doc), "#cloud-config\n") {
		t.Fatalf("does not start with #cloud-config:\n%s", doc)
	}
	var cc struct {
		Packages   []string `json:"packages"`
		Bootcmd    []string `json:"bootcmd"`
		WriteFiles []struct {
			Path        string `json:"path"`
			Owner       string `json:"owner"`
			Permissions string `json:"permissions"`
			Content     string `json:"content"`
			Defer       bool   `json:"defer"`
		} `json:"write_files"`
		Runcmd   [][]string `json:"runcmd"`
		MergeHow []struct {
			Name     string   `json:"name"`
			Settings []string `json:"settings"`
		} `json:"merge_how"`
	}
	if err := yaml.UnmarshalStrict(doc, &cc); err != nil {
		t.Fatal(err)
	}
	if len(cc.MergeHow) != 2 || cc.MergeHow[0].Name != "list" || cc.MergeHow[0].Settings[0] != "append" {
		t.Errorf("merge_how %+v: lists must be appended to the user's", cc.MergeHow)
	}
	// No packages: cloud-init would run the package manager even where tinyproxy is
	// installed; runcmd installs it only where it is missing.
	if len(cc.Packages) != 0 {
		t.Errorf("packages %v", cc.Packages)
	}
	wantBoot := "mkdir -p /etc/systemd/system/tinyproxy.service.d /usr/local/libexec\ncat >" + TinyproxyDropInPath + " <<'EOF'\n" +
		tinyproxyDropIn(false) + "EOF\ncat >" + FenceRetryUnitPath + " <<'EOF'\n" + fenceRetryUnit + "EOF\ncat >" +
		TinyproxyStartUnitPath + " <<'EOF'\n" + tinyproxyStartUnit + "EOF\ncat >" + TinyproxyPathUnitPath + " <<'EOF'\n" + tinyproxyPathUnit +
		"EOF\ncat >" + LinkRetryScriptPath + " <<'EOF'\n" + linkRetryScript + "EOF\nchmod 0755 " + LinkRetryScriptPath +
		"\ncat >" + LinkRetryUnitPath + " <<'EOF'\n" + linkRetryUnit +
		"EOF\nsystemctl daemon-reload\nsystemctl start --no-block " + TinyproxyPathUnit + "\nsystemctl enable --quiet " + LinkRetryUnit + "\nsystemctl start --no-block " + LinkRetryUnit + "\n"
	if len(cc.Bootcmd) != 1 || cc.Bootcmd[0] != wantBoot {
		t.Errorf("bootcmd %q, want [%q]", cc.Bootcmd, wantBoot)
	}
	for _, line := range []string{"DefaultDependencies=no", "ConditionPathExists=" + ConfigWrittenPath, "ExecStartPre=/bin/sh " + FenceScriptPath} {
		if !strings.Contains(tinyproxyDropIn(false), "\n"+line+"\n") {
			t.Errorf("the drop-in lacks %q:\n%s", line, tinyproxyDropIn(false))
		}
	}
	if len(cc.WriteFiles) != 4 {
		t.Fatalf("write_files %+v", cc.WriteFiles)
	}
	for i, want := range []struct{ path, perm string }{{TinyproxyConfPath, "0600"}, {FenceRulesetPath, "0644"}, {FenceScriptPath, "0755"}, {ConfigWrittenPath, "0644"}} {
		if f := cc.WriteFiles[i]; f.Path != want.path || f.Owner != "root:root" || f.Permissions != want.perm || f.Defer {
			t.Errorf("write_files[%d] %s %s %s defer=%v, want %s root:root %s written at once", i, f.Path, f.Owner, f.Permissions, f.Defer, want.path, want.perm)
		}
	}
	f := cc.WriteFiles[0]
	for _, line := range []string{"Port 3128", "Allow 10.0.0.0/8", "Allow 192.168.1.0/24", "Allow 2001:db8::/32",
		"BasicAuth crawler Xk9-q.Tr_22", "DisableViaHeader Yes", "ConnectPort 443", "User tinyproxy"} {
		if !strings.Contains("\n"+f.Content, "\n"+line+"\n") {
			t.Errorf("tinyproxy.conf lacks the line %q:\n%s", line, f.Content)
		}
	}
	if strings.Count(f.Content, "ConnectPort") != 1 {
		t.Errorf("CONNECT must be limited to 443 alone:\n%s", f.Content)
	}
	rules := cc.WriteFiles[1].Content
	for _, want := range []string{
		"elements = { 10.123.0.0/24 }", "elements = { fd00:1::/64 }", // the exceptions, as networks
		`meta skuid "tinyproxy" jump proxy_user`,
		"ip daddr @allowed4 accept", "ip daddr @fenced4 goto refuse", "ip6 daddr @fenced6 goto refuse",
		"ip daddr @own4 goto refuse", "fib daddr type local goto refuse",
	} {
		if !strings.Contains(rules, want) {
			t.Errorf("the ruleset lacks %q:\n%s", want, rules)
		}
	}
	// The metadata addresses are refused before any exception is looked at.
	if m, a := strings.Index(rules, "@metadata4 goto refuse"), strings.Index(rules, "@allowed4 accept"); m < 0 || a < 0 || m > a {
		t.Errorf("metadata refused at %d, exceptions at %d: the metadata rule must come first:\n%s", m, a, rules)
	}
	for _, n := range FencedNetworks {
		if !strings.Contains(rules, " "+n+",") && !strings.Contains(rules, " "+n+" }") {
			t.Errorf("the ruleset does not fence %s:\n%s", n, rules)
		}
	}
	if cc.WriteFiles[2].Content != fenceScript {
		t.Errorf("the fence script differs from fenceScript:\n%s", cc.WriteFiles[2].Content)
	}
	want := []string{
		"sh -c " + installIfMissing("nft", "nftables"),
		"sh -c " + installIfMissing("tinyproxy", "tinyproxy"),
		"systemctl start tinyproxy",
	}
	if len(cc.Runcmd) != len(want) {
		t.Fatalf("runcmd %v, want %d commands", cc.Runcmd, len(want))
	}
	for i, w := range want {
		if got := strings.Join(cc.Runcmd[i], " "); got != w {
			t.Errorf("runcmd[%d] %q, want %q", i, got, w)
		}
	}
}

// Without exceptions the allowed sets are empty, not missing: the rules name them.
func TestFenceWithoutExceptions(t *testing.T) {
	rules := fenceRuleset(nil)
	for _, set := range []string{"allowed4", "allowed6", "own4", "own6", "resolvers4", "resolvers6"} {
		if !strings.Contains(rules, "\tset "+set+" {") {
			t.Errorf("set %s missing:\n%s", set, rules)
		}
	}
	if strings.Count(rules, "elements = ") != 4 { // metadata4, metadata6, fenced4, fenced6
		t.Errorf("want elements in the metadata and fenced sets alone:\n%s", rules)
	}
}

// userDocs are user cloud-inits of each kind UserData combines.
var userDocs = map[string]string{
	"cloud-config": "#cloud-config\npackages: [htop]\nruncmd:\n  - [touch, /run/user-was-here]\n",
	"shellscript":  "#!/bin/sh\necho hello > /run/hello\n",
	"mime": "Content-Type: multipart/mixed; boundary=\"user-b\"\nMIME-Version: 1.0\n\n" +
		"--user-b\nContent-Type: text/cloud-config\n\n#cloud-config\ntimezone: Europe/Prague\n" +
		"--user-b\nContent-Type: text/x-shellscript\nContent-Transfer-Encoding: base64\n\nIyEvYmluL3NoCnRydWUK\n" +
		"--user-b--\n",
}

func TestUserDataGolden(t *testing.T) {
	alone, err := UserData(sampleConfig(), "")
	if err != nil {
		t.Fatal(err)
	}
	rendered, _ := CloudConfig(sampleConfig())
	if string(alone) != string(rendered) {
		t.Errorf("without a user cloud-init the user-data is not the rendered cloud-config alone:\n%s", alone)
	}
	for kind, user := range userDocs {
		got, err := UserData(sampleConfig(), user)
		if err != nil {
			t.Fatalf("%s: %v", kind, err)
		}
		testutil.Golden(t, "user-data-"+kind+".golden", got)
		again, _ := UserData(sampleConfig(), user)
		if string(again) != string(got) {
			t.Errorf("%s: two renderings differ, so would the spec hash", kind)
		}
	}
}

// readParts parses a multipart user-data document as cloud-init does and returns each
// part's media type and decoded body.
func readParts(t *testing.T, doc []byte) (types, bodies []string) {
	t.Helper()
	msg, err := mail.ReadMessage(strings.NewReader(string(doc)))
	if err != nil {
		t.Fatal(err)
	}
	if msg.Header.Get("Mime-Version") != "1.0" {
		t.Errorf("no MIME-Version header: cloud-init would not read it as MIME")
	}
	mt, params, err := mime.ParseMediaType(msg.Header.Get("Content-Type"))
	if err != nil || mt != "multipart/mixed" {
		t.Fatalf("content type %q: %v", mt, err)
	}
	r := multipart.NewReader(msg.Body, params["boundary"])
	for {
		p, err := r.NextPart()
		if errors.Is(err, io.EOF) {
			return types, bodies
		}
		if err != nil {
			t.Fatal(err)
		}
		pt, _, _ := mime.ParseMediaType(p.Header.Get("Content-Type"))
		b, _ := io.ReadAll(p)
		if p.Header.Get("Content-Transfer-Encoding") == "base64" {
			b = []byte(strings.TrimSpace(string(b))) // kept encoded, as given
		}
		types, bodies = append(types, pt), append(bodies, string(b))
	}
}

func TestUserDataParts(t *testing.T) {
	rendered, _ := CloudConfig(sampleConfig())
	for kind, want := range map[string][]string{
		"cloud-config": {"text/cloud-config", "text/cloud-config"},
		"shellscript":  {"text/x-shellscript", "text/cloud-config"},
		"mime":         {"text/cloud-config", "text/x-shellscript", "text/cloud-config"},
	} {
		doc, err := UserData(sampleConfig(), userDocs[kind])
		if err != nil {
			t.Fatal(err)
		}
		types, bodies := readParts(t, doc)
		if diff := cmp.Diff(want, types); diff != "" {
			t.Errorf("%s: part types (-want +got):\n%s", kind, diff)
			continue
		}
		if bodies[len(bodies)-1] != string(rendered) {
			t.Errorf("%s: the last part is not the rendered cloud-config:\n%s", kind, bodies[len(bodies)-1])
		}
		switch kind {
		case "mime":
			if bodies[0] != "#cloud-config\ntimezone: Europe/Prague" || bodies[1] != "IyEvYmluL3NoCnRydWUK" {
				t.Errorf("the user's parts changed: %q", bodies[:2])
			}
		default:
			if bodies[0] != userDocs[kind] {
				t.Errorf("%s: the user's part changed: %q", kind, bodies[0])
			}
		}
	}
}

func TestUserDataKinds(t *testing.T) {
	for first, want := range map[string]string{
		"#cloud-config":          "text/cloud-config",
		"#cloud-config-archive":  "text/cloud-config-archive",
		"#cloud-boothook":        "text/cloud-boothook",
		"#include":               "text/x-include-url",
		"#include-once":          "text/x-include-once-url",
		"#part-handler":          "text/part-handler",
		"## template: jinja":     "text/jinja2",
		"#!/usr/bin/env python3": "text/x-shellscript",
		"#cloud-config\r":        "text/cloud-config",
		"Content-Type: text/x-shellscript\nMIME-Version: 1.0\n": "text/x-shellscript",
		"MIME-Version: 1.0\nContent-Type: text/cloud-config\n":  "text/cloud-config",
	} {
		doc, err := UserData(sampleConfig(), first+"\nbody\n")
		if err != nil {
			t.Errorf("%q: %v", first, err)
			continue
		}
		if types, _ := readParts(t, doc); len(types) != 2 || types[0] != want {
			t.Errorf("%q: parts %v, want %s first", first, types, want)
		}
	}
}

func TestUserDataUTF8(t *testing.T) {
	doc, err := UserData(sampleConfig(), "#cloud-config\nfinal_message: Hotovo, příteli\n")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(doc), `text/cloud-config; charset=utf-8`) || !strings.Contains(string(doc), "Content-Transfer-Encoding: 8bit") {
		t.Errorf("a UTF-8 part is not labelled as such:\n%s", doc)
	}
}

func TestConfigFor(t *testing.T) {
	px := &v1alpha1.Proxy{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "crawl"}, Spec: v1alpha1.ProxySpec{
		Port:  3129,
		Proxy: &v1alpha1.ProxyConfig{AllowedSourceRanges: []v1alpha1.CIDR{"10.1.2.3/8", "192.0.2.7/32"}, AllowedDestinations: []v1alpha1.CIDR{"10.123.0.2/32"}},
	}}
	creds := &Credentials{Username: "u", Password: "p"}
	c := ConfigFor(px, creds)
	if c.Port != 3129 || strings.Join(c.AllowedSourceRanges, ",") != "10.1.2.3/8,192.0.2.7/32" || c.Credentials != creds ||
		strings.Join(c.AllowedDestinations, ",") != "10.123.0.2/32" {
		t.Fatalf("%+v", c)
	}
	conf, _, err := tinyproxyConf(c)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(conf, "\nAllow 10.0.0.0/8\n") || !strings.Contains(conf, "\nAllow 192.0.2.7/32\n") {
		t.Errorf("ranges not written as networks:\n%s", conf)
	}
}

func TestRenderErrors(t *testing.T) {
	long := strings.Repeat("a", 200)
	for _, tc := range []struct {
		name   string
		mutate func(*Config)
		user   string
		is     error
		want   string
	}{
		{"port zero", func(c *Config) { c.Port = 0 }, "", nil, "spec.port 0: want a port from 1 to 65535"},
		{"port too high", func(c *Config) { c.Port = 70000 }, "", nil, "spec.port 70000"},
		{"no ranges", func(c *Config) { c.AllowedSourceRanges = nil }, "", ErrNoSourceRanges, "spec.proxy.allowedSourceRanges is empty"},
		{"a range without prefix", func(c *Config) { c.AllowedSourceRanges = []string{"10.0.0.0/8", "10.0.0.1"} }, "", nil,
			`spec.proxy.allowedSourceRanges[1] "10.0.0.1": want a network in CIDR notation`},
		{"a zone", func(c *Config) { c.AllowedSourceRanges = []string{"fe80::%eth0/64"} }, "", nil, "spec.proxy.allowedSourceRanges[0]"},
		{"a destination without prefix", func(c *Config) { c.AllowedDestinations = []string{"10.123.0.2"} }, "", nil,
			`spec.proxy.allowedDestinations[0] "10.123.0.2": want a network in CIDR notation`},
		{"empty username", func(c *Config) { c.Credentials.Username = "" }, "", ErrBadCredentials, "username is empty"},
		{"empty password", func(c *Config) { c.Credentials.Password = "" }, "", ErrBadCredentials, "password is empty"},
		{"space in password", func(c *Config) { c.Credentials.Password = "two words" }, "", ErrBadCredentials,
			"password holds a character other than letters A-Z and a-z, digits, '-', '.' and '_'"},
		{"quote in username", func(c *Config) { c.Credentials.Username = `a"b` }, "", ErrBadCredentials, "username holds a character other than"},
		{"newline in password", func(c *Config) { c.Credentials.Password = "a\nAllow 0.0.0.0/0" }, "", ErrBadCredentials, "password holds a character"},
		{"hash in password", func(c *Config) { c.Credentials.Password = "a#b" }, "", ErrBadCredentials, "password holds a character"},
		{"colon in username", func(c *Config) { c.Credentials.Username = "a:b" }, "", ErrBadCredentials, "username holds a character"},
		{"non-ASCII password", func(c *Config) { c.Credentials.Password = "heslíčko" }, "", ErrBadCredentials, "password holds a character"},
		{"too long together", func(c *Config) { c.Credentials.Username, c.Credentials.Password = long, long[:57] }, "", ErrBadCredentials,
			"username and password are 257 characters together, at most 256"},
		{"plain-text user cloud-init", nil, "hello\n", ErrUserCloudInit, "its first line must say what it is"},
		{"gzip user cloud-init", nil, "\x1f\x8b\x08\x00\xff", ErrUserCloudInit, "not UTF-8 text"},
		{"bad MIME headers", nil, "Content-Type: text/plain\nno colon here\n\nx", ErrUserCloudInit, "reading its MIME headers"},
		{"bad Content-Type", nil, "Content-Type: ;;\n\nx", ErrUserCloudInit, "its Content-Type"},
		{"multipart without parts", nil, "Content-Type: multipart/mixed; boundary=b\n\n--b--\n", ErrUserCloudInit, "has no parts"},
		{"multipart cut short", nil, "Content-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/x-shellscript\n\n#!/bin/sh\n", ErrUserCloudInit,
			"reading part 1 of its multipart body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := sampleConfig()
			if tc.mutate != nil {
				tc.mutate(&c)
			}
			_, err := UserData(c, tc.user)
			if err == nil || !strings.Contains(err.Error(), tc.want) || (tc.is != nil && !errors.Is(err, tc.is)) {
				t.Fatalf("error %v, want one saying %q (and wrapping %v)", err, tc.want, tc.is)
			}
			if c.Credentials != nil && len(c.Credentials.Password) > 2 && strings.Contains(err.Error(), c.Credentials.Password) {
				t.Errorf("the error quotes the password: %v", err)
			}
			if tc.user != "" && strings.Contains(err.Error(), strings.TrimSpace(tc.user)) {
				t.Errorf("the error quotes the user's cloud-init: %v", err)
			}
			if _, herr := SpecHashInput(c, tc.user); herr == nil || herr.Error() != err.Error() {
				t.Errorf("SpecHashInput: %v, want the same error", herr)
			}
		})
	}
}
