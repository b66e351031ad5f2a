package client_test

import (
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"time"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/pkg/client"
)

// ExampleTransport is a complete crawler: it fetches pages through the egress proxies
// the discovery API picks for each page's host and prints what the Transport counted.
// The API's URL and the token file come from the environment, as a crawler's Pod has
// them: EGRESS_PROXIES_URL, the operator's discovery Service (such as
// http://egress-proxies-operator-controller-manager.egress-proxies-operator-system.svc:8082),
// and EGRESS_PROXIES_TOKEN_FILE, the Pod's projected ServiceAccount token or a file
// holding the static discovery token. Under go test they name a discovery API of the
// test's own over the proxies crawl/p1 and crawl/p2, and the site bans crawl/p2.
func ExampleTransport() {
	c, err := client.New(client.Config{
		URL:       os.Getenv("EGRESS_PROXIES_URL"),
		TokenFile: os.Getenv("EGRESS_PROXIES_TOKEN_FILE"),
	})
	if err != nil {
		log.Fatal(err)
	}
	tr := c.Transport(client.TransportConfig{
		Query:           client.Query{Namespace: "crawl"},
		OnFeedbackError: func(err error) { log.Print(err) },
	})
	hc := &http.Client{Transport: tr, Timeout: time.Minute}
	for _, page := range []string{"http://shop.example.com/page/1", "http://shop.example.com/page/2"} {
		res, err := hc.Get(page)
		if err != nil {
			// A saturated site is an error wrapping a *client.Error with Status 503 and RetryAfter.
			log.Fatal(err)
		}
		body, err := io.ReadAll(res.Body)
		res.Body.Close()
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: %d %s\n", page, res.StatusCode, body)
	}
	tr.Close() // sends the reports still waiting
	st := tr.Stats()
	fmt.Printf("requests %d, attempts %d, retries %d, banned %d, ok %d, reports taken %d\n",
		st.Requests, st.Attempts, st.Retries, st.Banned, st.OK, st.Reported)
	// Output:
	// http://shop.example.com/page/1: 200 /page/1 via p1
	// http://shop.example.com/page/2: 200 /page/2 via p1
	// requests 2, attempts 3, retries 1, banned 1, ok 2, reports taken 3
}
