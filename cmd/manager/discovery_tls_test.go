package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/testenv"
)

// testCA signs serving certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "discovery test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// issue writes a certificate for 127.0.0.1 with serial into dir as tls.crt and tls.key,
// each replaced by a rename, as a Secret volume or cert-manager updates them.
func (ca *testCA) issue(t *testing.T, dir string, serial int64) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "discovery"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	for name, block := range map[string]*pem.Block{"tls.key": {Type: "EC PRIVATE KEY", Bytes: kder}, "tls.crt": {Type: "CERTIFICATE", Bytes: der}} {
		tmp := filepath.Join(dir, "."+name+".tmp")
		if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

// The manager binary serves discovery over TLS with --discovery-cert-dir: a client that
// trusts only the test CA verifies the certificate, plain HTTP gets no listing, and a
// certificate rotated on disk is served without a restart. Without the flag, a manager
// that would hand out credentials over plain HTTP says so once at start.
func TestManagerDiscoveryOverTLS(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	ca := newTestCA(t)
	certs := t.TempDir()
	ca.issue(t, certs, 100)

	mgr, disc := startProbingManager(t, env, "--discovery-cert-dir", certs)
	var served atomic.Pointer[x509.Certificate]
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true, // each request a new handshake, so a rotation shows
		TLSClientConfig: &tls.Config{RootCAs: ca.pool, MinVersion: tls.VersionTLS12,
			VerifyConnection: func(cs tls.ConnectionState) error { served.Store(cs.PeerCertificates[0]); return nil }},
	}}
	get := func() (int, string) {
		req, _ := http.NewRequest(http.MethodGet, "https://"+disc+"/v1/proxies", nil)
		req.Header.Set("Authorization", "Bearer t0ken")
		res, err := client.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.StatusCode, string(b)
	}
	mgr.waitUntil("the discovery API to answer over verified TLS", func() (bool, error) {
		code, body := get()
		return code == http.StatusOK, fmt.Errorf("%d %s", code, body)
	})
	if seen := served.Load(); seen == nil || seen.SerialNumber.Int64() != 100 {
		t.Fatalf("served certificate %v, want serial 100", seen)
	}
	if res, err := http.Get("http://" + disc + "/v1/proxies"); err == nil {
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if strings.Contains(string(body), `"proxies"`) {
			t.Errorf("plain HTTP got a listing: %d %s", res.StatusCode, body)
		}
	}
	// A client that does not trust the test CA is refused by its own verification.
	if _, err := (&http.Client{Timeout: 10 * time.Second}).Get("https://" + disc + "/v1/whoami"); err == nil ||
		!strings.Contains(err.Error(), "certificate") {
		t.Errorf("a client without the test CA: %v, want a certificate verification error", err)
	}

	ca.issue(t, certs, 200)
	mgr.waitUntil("the rotated certificate (serial 200) to be served without a restart", func() (bool, error) {
		code, body := get()
		seen := served.Load()
		if code != http.StatusOK || seen == nil {
			return false, fmt.Errorf("%d %s", code, body)
		}
		return seen.SerialNumber.Int64() == 200, fmt.Errorf("still serial %d", seen.SerialNumber.Int64())
	})
	if n := strings.Count(mgr.stderr.String(), "over plain HTTP"); n != 0 {
		t.Errorf("the plain-HTTP warning was logged %d times with TLS on", n)
	}
	mgr.stop()

	plain, _ := startProbingManager(t, env)
	plain.waitUntil("the plain-HTTP warning about ?credentials=true", func() (bool, error) {
		return strings.Contains(plain.stderr.String(), "discovery api listening"), nil
	})
	if n := strings.Count(plain.stderr.String(), "serves ?credentials=true, proxy passwords, and takes bearer tokens over plain HTTP"); n != 1 {
		t.Errorf("the plain-HTTP warning was logged %d times, want once; stderr:\n%s", n, plain.stderr.String())
	}
	plain.stop()
}

// A missing certificate directory stops the manager at start, naming it.
func TestManagerDiscoveryCertDirMissing(t *testing.T) {
	t.Parallel()
	env := testenv.StartT(t)
	missing := filepath.Join(t.TempDir(), "nope")
	mgr, _ := startProbingManager(t, env, "--discovery-cert-dir", missing)
	select {
	case err := <-mgr.exited:
		if err == nil || !strings.Contains(mgr.stderr.String(), "--discovery-cert-dir "+missing) {
			t.Fatalf("exit %v; stderr:\n%s", err, mgr.stderr.String())
		}
	case <-time.After(time.Minute):
		t.Fatalf("the manager still runs a minute after start with a missing --discovery-cert-dir; stderr:\n%s", mgr.stderr.String())
	}
}
