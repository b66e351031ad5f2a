package remediation

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// A record's JSON is stable: what Plan stores reads back equal and encodes to the same
// bytes, in the form a status field would take.
func TestRecordRoundTrip(t *testing.T) {
	res, err := Plan(Input{Now: at(10*time.Minute + 1500*time.Millisecond), Proxies: []State{{Key: "a", Started: t0.In(time.FixedZone("CET", 3600))}}})
	if err != nil {
		t.Fatal(err)
	}
	r := res.Decisions[0].Record
	want := `{"reason":"BootTimeout","attempt":1,"action":"Replace","at":"2026-12-04T10:10:01Z","faultSince":"2026-12-04T10:00:00Z"}`
	if got := r.Encode(); got != want {
		t.Fatalf("Encode = %s, want %s", got, want)
	}
	back, err := ParseRecord(r.Encode())
	if err != nil || *back != *r || back.Encode() != want {
		t.Errorf("ParseRecord(Encode()) = %+v, %v; want %+v", back, err, r)
	}
	var asField struct {
		R *Record `json:"remediation,omitempty"`
	}
	if err := json.Unmarshal([]byte(`{"remediation":`+want+`}`), &asField); err != nil || *asField.R != *r {
		t.Errorf("as a status field: %+v, %v", asField.R, err)
	}
	if r, err := ParseRecord(""); r != nil || err != nil {
		t.Errorf(`ParseRecord("") = %v, %v; want no record`, r, err)
	}
}

func TestParseRecordErrors(t *testing.T) {
	for in, msg := range map[string]string{
		`{`: "annotation egress.hrajfrisbee.cz/remediation: unexpected end of JSON input",
		`{"reason":"Bored","attempt":1,"action":"Reboot","at":"2026-12-04T10:10:00Z"}`:     `annotation egress.hrajfrisbee.cz/remediation: reason "Bored": want BootTimeout or Unhealthy`,
		`{"reason":"Unhealthy","attempt":1,"action":"Kick","at":"2026-12-04T10:10:00Z"}`:   `annotation egress.hrajfrisbee.cz/remediation: action "Kick": want Reboot or Replace`,
		`{"reason":"Unhealthy","attempt":0,"action":"Reboot","at":"2026-12-04T10:10:00Z"}`: "annotation egress.hrajfrisbee.cz/remediation: attempt 0: want 1 or more",
		`{"reason":"Unhealthy","attempt":1,"action":"Reboot"}`:                             "annotation egress.hrajfrisbee.cz/remediation: at is missing",
		`{"reason":"Unhealthy","attempt":1,"action":"Reboot","at":"yesterday"}`:            "annotation egress.hrajfrisbee.cz/remediation: parsing time",
	} {
		if r, err := ParseRecord(in); err == nil || r != nil || !strings.Contains(err.Error(), msg) {
			t.Errorf("ParseRecord(%s) = %+v, %v; want an error saying %q", in, r, err, msg)
		}
	}
}
