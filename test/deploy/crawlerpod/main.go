// Command crawlerpod is the crawler Pod of make test-deploy: it calls the discovery API as
// a crawler in the cluster does, with its own projected ServiceAccount token, and prints
// what it was answered, one JSON line per URL, for the test to read from the Pod's log:
//
//	{"url":"http://10.125.0.17:8082/v1/proxies?format=text","status":200,"body":"http://…\n"}
//
// With -proxy-token it is a crawler using the gateway instead: each GET goes through the
// proxy of $HTTP_PROXY (whose user name carries the gateway's options), with the token as
// the proxy password and no Authorization header, and each line also says which exit the
// gateway used (its X-Egress-Proxy and X-Egress-IP headers):
//
//	{"url":"http://10.123.0.1:8000/x","status":200,"body":"…","egressProxy":"default/p","egressIP":"10.123.0.57"}
//
// It exits 1 when a URL could not be fetched at all (or the token file read), 0 whatever
// the statuses.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"
)

func main() {
	tokenFile := flag.String("token-file", "/var/run/secrets/tokens/discovery", "The file holding the bearer token (a projected ServiceAccount token).")
	proxyToken := flag.Bool("proxy-token", false, "GET through the proxy of $HTTP_PROXY with the token as the proxy password (the gateway's way), not with an Authorization header.")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: crawlerpod [-token-file F] [-proxy-token] URL...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*tokenFile, *proxyToken, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "crawlerpod:", err)
		os.Exit(1)
	}
}

func run(tokenFile string, proxyToken bool, urls []string) error {
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	hc := &http.Client{Timeout: 10 * time.Second}
	if proxyToken {
		tr := http.DefaultTransport.(*http.Transport).Clone()
		tr.Proxy = func(r *http.Request) (*url.URL, error) {
			u, err := http.ProxyFromEnvironment(r)
			if err != nil || u == nil {
				return nil, fmt.Errorf("no proxy for %s in HTTP_PROXY (%v)", r.URL, err)
			}
			withToken := *u
			withToken.User = url.UserPassword(u.User.Username(), token)
			return &withToken, nil
		}
		hc.Transport = tr
	}
	out := json.NewEncoder(os.Stdout)
	for _, u := range urls {
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			return fmt.Errorf("GET %s: %w", u, err)
		}
		if !proxyToken {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := hc.Do(req)
		if err != nil {
			return err // names the method and the URL
		}
		body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		res.Body.Close()
		if err != nil {
			return fmt.Errorf("GET %s: reading the answer (status %d): %w", u, res.StatusCode, err)
		}
		line := map[string]any{"url": u, "status": res.StatusCode, "body": string(body)}
		if proxyToken {
			line["egressProxy"], line["egressIP"] = res.Header.Get("X-Egress-Proxy"), res.Header.Get("X-Egress-IP")
		}
		if err := out.Encode(line); err != nil {
			return err
		}
	}
	return nil
}
