package discovery

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
)

// A retryAfterSeconds out of range, too large for a float64, or not a number rejects
// its own report with an error naming the field; the other reports of the body are
// taken. A site's domain over the DNS limits is rejected the same way.
func TestFeedbackBadNumbersRejectTheirReportOnly(t *testing.T) {
	sk := &sink{}
	h := tokenServerOpts(t, fixture(), Options{Feedback: sk})
	report := func(ra string) string {
		return `{"proxy":"crawl/a","domain":"example.com","outcome":"throttled","retryAfterSeconds":` + ra + `}`
	}
	long := strings.Repeat("a", 42) + strings.Repeat(".abcde", 41) + ".example.com"
	bad := []string{report("1e999"), report("-1e999"), report("86400.5"), report("-0.5"), report(`"30"`), report("true"),
		`{"proxy":"crawl/a","domain":"` + long + `","outcome":"banned"}`}
	good := []string{report("86400"), report("null"), report("2.5"), `{"proxy":"crawl/b","domain":"example.com","outcome":"banned"}`}
	res, got := post(t, h, "/v1/feedback", `{"reports":[`+strings.Join(append(bad, good...), ",")+`]}`, "Authorization", bearer)
	if res.StatusCode != http.StatusOK {
		t.Fatalf("status %d: %s, want 200 with the bad reports rejected one by one", res.StatusCode, got)
	}
	var ans feedbackAnswer
	if err := json.Unmarshal([]byte(got), &ans); err != nil {
		t.Fatal(err)
	}
	if ans.Accepted != len(good) || len(ans.Rejected) != len(bad) {
		t.Fatalf("answer %s, want %d accepted and %d rejected", got, len(good), len(bad))
	}
	for i, want := range []string{"retryAfterSeconds 1e999: give a number of seconds from 0 to 86400", "retryAfterSeconds -1e999",
		"retryAfterSeconds 86400.5", "retryAfterSeconds -0.5", `retryAfterSeconds "30"`, "retryAfterSeconds true",
		"domain: bad domain \"" + long[:64] + "\"...: 300 characters in ASCII form; a DNS name has at most 253"} {
		if r := ans.Rejected[i]; r.Index != i || !strings.Contains(r.Error, want) {
			t.Errorf("rejection %d: %+v, want it saying %q", i, r, want)
		}
	}
	want := "crawl/a example.com throttled 24h0m0s|crawl/a example.com throttled 0s|crawl/a example.com throttled 2.5s|crawl/b example.com banned 0s"
	if g := strings.Join(sk.got, "|"); g != want {
		t.Errorf("sink got %q, want %q", g, want)
	}
}

// Infinity and NaN are not JSON: the body is refused whole, with an answer that says so
// and how to send the field instead, and nothing is taken.
func TestFeedbackInfinityAndNaNAreExplained(t *testing.T) {
	sk := &sink{}
	h := tokenServerOpts(t, fixture(), Options{Feedback: sk})
	for _, v := range []string{"Infinity", "-Infinity", "NaN"} {
		body := `{"reports":[{"proxy":"crawl/b","domain":"example.com","outcome":"banned"},` +
			`{"proxy":"crawl/a","domain":"example.com","outcome":"throttled","retryAfterSeconds":` + v + `}]}`
		res, got := post(t, h, "/v1/feedback", body, "Authorization", bearer)
		if res.StatusCode != http.StatusBadRequest || !strings.Contains(got, "JSON has no Infinity or NaN: leave retryAfterSeconds out or give a number of seconds from 0 to 86400") {
			t.Errorf("%s: %d %s, want 400 explaining that JSON has no %s", v, res.StatusCode, got, v)
		}
	}
	if len(sk.got) != 0 {
		t.Errorf("bodies that are not JSON changed state: %v", sk.got)
	}
}
