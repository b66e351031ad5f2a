// Command crawlerpod is the crawler Pod of make test-deploy: it calls the discovery API as
// a crawler in the cluster does, with its own projected ServiceAccount token, and prints
// what it was answered, one JSON line per URL, for the test to read from the Pod's log:
//
//	{"url":"http://10.125.0.17:8082/v1/proxies?format=text","status":200,"body":"http://…\n"}
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
	"os"
	"strings"
	"time"
)

func main() {
	tokenFile := flag.String("token-file", "/var/run/secrets/tokens/discovery", "The file holding the bearer token (a projected ServiceAccount token).")
	flag.Usage = func() {
		fmt.Fprintln(os.Stderr, "usage: crawlerpod [-token-file F] URL...")
		flag.PrintDefaults()
	}
	flag.Parse()
	if flag.NArg() == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := run(*tokenFile, flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "crawlerpod:", err)
		os.Exit(1)
	}
}

func run(tokenFile string, urls []string) error {
	b, err := os.ReadFile(tokenFile)
	if err != nil {
		return fmt.Errorf("token file: %w", err)
	}
	token := strings.TrimSpace(string(b))
	hc := &http.Client{Timeout: 10 * time.Second}
	out := json.NewEncoder(os.Stdout)
	for _, u := range urls {
		req, err := http.NewRequest(http.MethodGet, u, nil)
		if err != nil {
			return fmt.Errorf("GET %s: %w", u, err)
		}
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := hc.Do(req)
		if err != nil {
			return err // names the method and the URL
		}
		body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
		res.Body.Close()
		if err != nil {
			return fmt.Errorf("GET %s: reading the answer (status %d): %w", u, res.StatusCode, err)
		}
		if err := out.Encode(map[string]any{"url": u, "status": res.StatusCode, "body": string(body)}); err != nil {
			return err
		}
	}
	return nil
}
