package main

import (
	"io"
	"maps"
	"slices"
	"strings"
	"testing"
)

// Without --watch-namespaces the manager watches every namespace: its cache has no
// DefaultNamespaces.
func TestWatchNamespacesDefaultsToAll(t *testing.T) {
	o, err := parseFlags(nil, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if o.watchNamespaces != nil || cacheNamespaces(o.watchNamespaces) != nil {
		t.Errorf("--watch-namespaces defaults to %v (cache namespaces %v), want every namespace", o.watchNamespaces, cacheNamespaces(o.watchNamespaces))
	}
}

func TestWatchNamespacesFlag(t *testing.T) {
	o, err := parseFlags([]string{"--watch-namespaces", "team-a, team-b", "--install-id", "team-ab"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"team-a", "team-b"}; !slices.Equal(o.watchNamespaces, want) {
		t.Errorf("--watch-namespaces team-a,team-b: %v, want %v", o.watchNamespaces, want)
	}
	if got := slices.Sorted(maps.Keys(cacheNamespaces(o.watchNamespaces))); !slices.Equal(got, []string{"team-a", "team-b"}) {
		t.Errorf("the cache watches %v, want team-a and team-b", got)
	}
	for _, tc := range []struct{ value, want string }{
		{"Team-A", `namespace "Team-A"`},
		{"team-a,,team-b", `namespace ""`},
		{"team-a,", `namespace ""`},
		{"team_a", `namespace "team_a"`},
		{strings.Repeat("a", 64), "must be no more than 63"},
		{"team-a,team-b,team-a", `namespace "team-a" is listed twice`},
		{"-team", `namespace "-team"`},
	} {
		_, err := parseFlags([]string{"--watch-namespaces=" + tc.value, "--install-id=team-ab"}, io.Discard)
		if err == nil || !strings.Contains(err.Error(), "--watch-namespaces") || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("--watch-namespaces=%q: %v, want an error naming the flag and %s", tc.value, err, tc.want)
		}
	}
}

// --watch-namespaces without --install-id is refused: under the default install id,
// shared by every install of the cluster, a narrowed install's orphan GC would delete the
// instances of Proxies in the namespaces it does not see.
func TestWatchNamespacesNeedAnInstallID(t *testing.T) {
	_, err := parseFlags([]string{"--watch-namespaces=team-a"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "--watch-namespaces needs --install-id") {
		t.Fatalf("--watch-namespaces without --install-id: %v, want an error naming both flags", err)
	}
}
