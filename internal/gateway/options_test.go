package gateway

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"k8s.io/apimachinery/pkg/util/validation"
)

func TestParseOptions(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want Options
	}{
		{"", Options{}},
		{"crawler", Options{User: "crawler"}},
		{"crawler+pool=news", Options{User: "crawler", Pool: "news"}},
		{"USER+pool=news+session=abc123+sesstime=10m+strict", Options{User: "USER", Pool: "news", Session: "abc123", SessionTTL: 10 * time.Minute, Strict: true}},
		{"u+ns=crawlers+pool=eu.news-1+session=A_b.c~d-e+sesstime=90s+soft+ip=6", Options{User: "u", Namespace: "crawlers", Pool: "eu.news-1", Session: "A_b.c~d-e", SessionTTL: 90 * time.Second, Family: FamilyIPv6}},
		{"+ip=4", Options{Family: FamilyIPv4}},
		{"x+session=s+sesstime=24h", Options{User: "x", Session: "s", SessionTTL: MaxSessionTTL}},
		{"u+provider=gce-eu+region=europe-west1+zone=europe-west1-b", Options{User: "u", Provider: "gce-eu", Region: "europe-west1", Zone: "europe-west1-b"}},
		{"u+labels=tier=gold,team!=x+pool=news", Options{User: "u", Labels: "tier=gold,team!=x", Pool: "news"}},
		{"u+labels=tier in (gold,silver),!canary", Options{User: "u", Labels: "tier in (gold,silver),!canary"}},
	} {
		got, err := ParseOptions(tc.in)
		if err != nil {
			t.Errorf("ParseOptions(%q): %v", tc.in, err)
			continue
		}
		if diff := cmp.Diff(tc.want, got); diff != "" {
			t.Errorf("ParseOptions(%q) (-want +got):\n%s", tc.in, diff)
		}
	}
}

func TestParseOptionsErrorsNameTheOption(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"u+bogus=1", `unknown option "bogus"`},
		{"u+country=de", `unknown option "country"`},
		{"u+pool=news+pool=web", "option pool given twice"},
		{"u++pool=news", "empty option"},
		{"u+pool=news+", "empty option"},
		{"u+pool", "option pool needs a value"},
		{"u+pool=", "option pool needs a value"},
		{"u+session=+strict", "option session needs a value"},
		{"u+strict=yes+session=a", "option strict takes no value"},
		{"u+session=a+strict+soft", "options strict and soft exclude each other"},
		{"u+strict", "option strict needs a session"},
		{"u+sesstime=10m", "option sesstime needs a session"},
		{"u+session=a+sesstime=forever", `option sesstime: "forever" is not a duration`},
		{"u+session=a+sesstime=48h", "option sesstime: 48h0m0s is not a whole number of seconds from 1s to 24h"},
		{"u+session=a+sesstime=1500ms", "option sesstime: 1.5s is not a whole number"},
		{"u+session=a+sesstime=0s", "option sesstime"},
		{"u+ip=5", `option ip must be 4 or 6, not "5"`},
		{"u+ns=Crawlers", `option ns: "Crawlers" is not a namespace name`},
		{"u+ns=a.b", `option ns: "a.b" is not a namespace name`},
		{"u+pool=News", `option pool: "News" is not a pool name`},
		{"u+session=a/b", `option session: "a/b" has '/'`},
		{"u+session=" + strings.Repeat("s", MaxSessionIDLength+1), "option session: longer than 128 characters"},
		{"us@er+pool=a", `the user part "us@er" has '@'`},
		{"u+zone=a/b", `option zone: "a/b" has '/'`},
		{"u+region=" + strings.Repeat("r", MaxPlacementLength+1), "option region: longer than 63 characters"},
		{"u+provider=", "option provider needs a value"},
		{"u+labels=tier===x", `option labels: "tier===x" is not a label selector`},
		{"u+labels=a=b+labels=c=d", "option labels given twice"},
	} {
		_, err := ParseOptions(tc.in)
		if err == nil {
			t.Errorf("ParseOptions(%q) = nil error, want one containing %q", tc.in, tc.want)
			continue
		}
		if !errors.Is(err, ErrBadOptions) {
			t.Errorf("ParseOptions(%q): %v is not ErrBadOptions", tc.in, err)
		}
		if !strings.Contains(err.Error(), tc.want) {
			t.Errorf("ParseOptions(%q) = %q, want it to contain %q", tc.in, err, tc.want)
		}
	}
}

func TestFormatIsCanonical(t *testing.T) {
	o := Options{User: "u", Namespace: "ns1", Pool: "p", Session: "s", SessionTTL: 2 * time.Hour, Strict: true, Family: FamilyIPv4,
		Provider: "kvm2", Region: "home", Zone: "rack1", Labels: "tier=gold"}
	if got, want := o.Format(), "u+ns=ns1+pool=p+provider=kvm2+region=home+zone=rack1+labels=tier=gold+session=s+sesstime=2h+strict+ip=4"; got != want {
		t.Errorf("Format = %q, want %q", got, want)
	}
	if got := (Options{Session: "s"}).TTL(); got != DefaultSessionTTL {
		t.Errorf("default TTL = %s, want %s", got, DefaultSessionTTL)
	}
}

// FuzzOptionsRoundTrip: every namespace Kubernetes accepts (a DNS-1123 label), every pool
// name (a DNS-1123 subdomain) and every valid session id survive Format then ParseOptions.
//
//fuzzsmoke:count 10000
func FuzzOptionsRoundTrip(f *testing.F) {
	f.Add("u", "crawlers", "news", "abc123", uint32(600), true, uint8(4))
	f.Add("", "a", "eu.news-1.x", "A_b.c~d-e", uint32(0), false, uint8(0))
	f.Add("x", "0", "9", "-", uint32(86400), true, uint8(6))
	f.Fuzz(func(t *testing.T, user, ns, pool, session string, ttl uint32, strict bool, family uint8) {
		o := Options{User: user, Namespace: ns, Pool: pool, Session: session,
			SessionTTL: time.Duration(ttl) * time.Second, Strict: strict, Family: Family(family)}
		if o.Session == "" {
			o.SessionTTL, o.Strict = 0, false
		}
		nsValid := ns == "" || len(validation.IsDNS1123Label(ns)) == 0
		poolValid := pool == "" || len(validation.IsDNS1123Subdomain(pool)) == 0
		err := o.Validate()
		if nsValid && poolValid && validSession(session) && validSession(user) && len(user) <= MaxUserLength &&
			o.SessionTTL <= MaxSessionTTL && (family == 0 || family == 4 || family == 6) && err != nil {
			t.Fatalf("Validate(%+v) refused valid options: %v", o, err)
		}
		if err != nil {
			return
		}
		got, err := ParseOptions(o.Format())
		if err != nil {
			t.Fatalf("ParseOptions(%q) of valid %+v: %v", o.Format(), o, err)
		}
		if diff := cmp.Diff(o, got); diff != "" {
			t.Fatalf("round trip of %q (-want +got):\n%s", o.Format(), diff)
		}
	})
}

func validSession(s string) bool {
	if len(s) > MaxSessionIDLength {
		return false
	}
	for _, r := range s {
		if !isSessionRune(r) {
			return false
		}
	}
	return true
}

// FuzzParseOptions: any user name either fails with ErrBadOptions or reads back to the
// same options after Format.
//
//fuzzsmoke:count 10000
func FuzzParseOptions(f *testing.F) {
	for _, s := range []string{"", "u+pool=a", "u+session=s+sesstime=10m+strict", "u+ip=6+soft", "++", "u+a=b=c", "u+sesstime=1h1m"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		o, err := ParseOptions(s)
		if err != nil {
			if !errors.Is(err, ErrBadOptions) {
				t.Fatalf("ParseOptions(%q): %v is not ErrBadOptions", s, err)
			}
			return
		}
		again, err := ParseOptions(o.Format())
		if err != nil {
			t.Fatalf("ParseOptions(Format(%q) = %q): %v", s, o.Format(), err)
		}
		if diff := cmp.Diff(o, again); diff != "" {
			t.Fatalf("%q (-first +again):\n%s", s, diff)
		}
	})
}
