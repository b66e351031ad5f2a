package client_test

import (
	"context"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strings"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

// ExampleGatewayTransport is a complete crawler going through the gateway: one proxy URL,
// its options in the proxy user name, a session per basket, and the site's bans reported
// by the exit the gateway names in X-Egress-Proxy. EGRESS_PROXIES_GATEWAY is the
// gateway's HTTP proxy (such as http://egress-proxies-gateway.egress-proxies-operator-system.svc:8080);
// EGRESS_PROXIES_URL and EGRESS_PROXIES_TOKEN_FILE are as in ExampleTransport (the token
// is also the gateway's proxy password). Under go test the site bans crawl/p2, the exit
// the session basket-2 maps to.
func ExampleGatewayTransport() {
	c, err := client.New(client.Config{
		URL:       os.Getenv("EGRESS_PROXIES_URL"),
		TokenFile: os.Getenv("EGRESS_PROXIES_TOKEN_FILE"),
	})
	if err != nil {
		log.Fatal(err)
	}
	gt, err := c.GatewayTransport(client.GatewayConfig{
		URL:             os.Getenv("EGRESS_PROXIES_GATEWAY"),
		Options:         client.GatewayOptions{User: "example", Namespace: "crawl"},
		OnFeedbackError: func(err error) { log.Print(err) },
	})
	if err != nil {
		log.Fatal(err) // a bad URL or option, named
	}
	hc := &http.Client{Transport: gt, Timeout: time.Minute}
	for _, basket := range []string{"basket-1", "basket-2"} {
		ctx := client.WithSession(context.Background(), basket) // every request of a basket leaves through one exit
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://shop.example.org/"+basket, nil)
		if err != nil {
			log.Fatal(err)
		}
		res, err := hc.Do(req)
		if err != nil {
			// The gateway's own refusal is an error wrapping a *client.GatewayError.
			log.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %d %s (exit %s)\n", basket, res.StatusCode, strings.TrimSpace(string(body)), res.Header.Get(client.HeaderEgressProxy))
	}
	gt.Close() // sends the reports still waiting
	st := gt.Stats()
	fmt.Printf("requests %d, banned %d, ok %d, reports taken %d\n", st.Requests, st.Banned, st.OK, st.Reported)
	// Output:
	// basket-1: 200 /basket-1 via p1 (exit crawl/p1)
	// basket-2: 403 forbidden (exit crawl/p2)
	// requests 2, banned 1, ok 1, reports taken 2
}
