package kvm2

import (
	"bytes"
	"context"
	"os"
	"strings"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// secretsOf returns the pieces of the credential files that must never surface: every
// base64 line of the private key and the host key in known_hosts.
func secretsOf(t *testing.T, e *testEnv) []string {
	t.Helper()
	var out []string
	key, err := os.ReadFile(e.ssh.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(key), "\n") {
		if l != "" && !strings.HasPrefix(l, "-----") {
			out = append(out, l)
		}
	}
	kh, err := os.ReadFile(e.ssh.KnownHostsFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(kh)) {
		if len(f) > 40 { // the hashed host name and the key
			out = append(out, f)
		}
	}
	if len(out) < 3 {
		t.Fatalf("found only %d secret pieces; the test would prove nothing", len(out))
	}
	return out
}

// At the most verbose level, across successful calls, uploads, failed dials and a health
// check, neither the logs, nor the errors, nor the span attributes carry key material,
// known_hosts content or upload bodies (the seed's user-data: the configuration rendered
// from spec.proxy, with the basic-auth password, combined with the user's cloud-init).
func TestNeverLogged(t *testing.T) {
	e := newTestEnv(t, withSSH(), withTestHost("hv"), withLogVerbosity(2))
	secrets := secretsOf(t, e)
	const password = "pw-marker-2c9d-never-logged"
	const wgKey = "yAnz5TF+lXXJte14tji3zlMNq+hd2rYUIgJBgB3fBmk=" // a WireGuard private key
	wg, err := proxyconfig.ParseWireGuard("[Interface]\nPrivateKey = " + wgKey + "\nAddress = 10.64.0.2/32\n[Peer]\n" +
		"PublicKey = xTIBA5rboUvnH4htodjb6e697QjLERt1NAB4mZqp8Dg=\nEndpoint = 198.51.100.7:51820\nAllowedIPs = 0.0.0.0/0\n")
	if err != nil {
		t.Fatal(err)
	}
	rendered, err := proxyconfig.UserData(proxyconfig.Config{Port: 3128, AllowedSourceRanges: []string{"10.0.0.0/8"},
		Credentials: &proxyconfig.Credentials{Username: "crawler", Password: password}, WireGuard: wg},
		"#cloud-config\n# marker-7f3a9c-never-logged\nruncmd: [echo hi]\n")
	if err != nil {
		t.Fatal(err)
	}
	cloudInit := string(rendered)
	secrets = append(secrets, "marker-7f3a9c-never-logged", password, wgKey, "BasicAuth crawler", "DisableViaHeader", "multipart/mixed")
	var errs []string
	note := func(err error) {
		if err != nil {
			errs = append(errs, err.Error())
		}
	}
	ctx := context.Background()

	b := must(e.hs.pooled(ctx, e.host))
	pool := must(b.StoragePoolLookupByName("default"))
	vol, err := b.StorageVolCreateXML(pool, rawVolumeXMLForTest("proxy-x-seed.iso", uint64(len(cloudInit))), 0)
	if err != nil {
		t.Fatal(err)
	}
	note(b.StorageVolUpload(vol, strings.NewReader(cloudInit), 0, uint64(len(cloudInit)), 0))
	var back bytes.Buffer
	note(b.StorageVolDownload(vol, &back, 0, uint64(len(cloudInit)), 0))
	if back.String() != cloudInit {
		t.Fatalf("the upload did not arrive: %q", back.String())
	}
	must(b.StorageVolGetPath(vol))
	e.hs.check(ctx)

	// A key file holding the real key's base64 under a header x/crypto does not know.
	keyBytes := must(os.ReadFile(e.ssh.KeyFile))
	mangled := strings.Replace(string(keyBytes), "OPENSSH PRIVATE KEY", "FANCY PRIVATE KEY", 2)
	writeFile(t, e.ssh.KeyFile, []byte(mangled))
	_, _, err = e.hs.dialFresh(ctx, e.host)
	note(err)
	e.hs.check(ctx)
	writeFile(t, e.ssh.KeyFile, keyBytes)
	// A changed host key.
	must(e.ssh.RotateHostKey())
	_, _, err = e.hs.dialFresh(ctx, e.host)
	note(err)
	e.hs.check(ctx)
	if len(errs) < 2 {
		t.Fatalf("only %d failures happened; the failure paths were not exercised", len(errs))
	}

	haystacks := append(e.logs.all(), errs...)
	for _, s := range spansFor(e.host) {
		for _, a := range s.Attributes() {
			haystacks = append(haystacks, a.Value.String())
		}
		for _, ev := range s.Events() {
			for _, a := range ev.Attributes {
				haystacks = append(haystacks, a.Value.String())
			}
		}
		haystacks = append(haystacks, s.Status().Description)
	}
	if len(e.logs.find(`"rpc":"StorageVolUpload"`, `"length":`)) == 0 {
		t.Fatalf("no upload line at V(2); the search below would prove nothing: %q", e.logs.all())
	}
	for _, secret := range secrets {
		for _, h := range haystacks {
			if strings.Contains(h, secret) {
				t.Errorf("%q leaked into %s", secret, h)
			}
		}
	}
}
