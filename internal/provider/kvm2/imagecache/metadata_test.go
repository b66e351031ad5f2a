package imagecache

import (
	"net/netip"
	"testing"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// Every metadata server the proxies' fence refuses is also never fetched by the image
// cache, even where a prefix list admits everything else (GCE's IPv6 server was once
// missing here).
func TestRefusedAddrRefusesEveryMetadataServer(t *testing.T) {
	for _, s := range append([]string{"fd20:ce::254", "100.100.100.200"}, proxyconfig.MetadataAddrs...) {
		a := netip.MustParseAddr(s)
		for _, onlyMetadata := range []bool{false, true} {
			if got := RefusedAddr(a, onlyMetadata); got != metadataWhat {
				t.Errorf("RefusedAddr(%s, onlyMetadata=%v) = %q, want %q", a, onlyMetadata, got, metadataWhat)
			}
		}
	}
	if got := RefusedAddr(netip.MustParseAddr("fd20:ce::253"), true); got != "" {
		t.Errorf("RefusedAddr(fd20:ce::253, onlyMetadata) = %q, want it admitted", got)
	}
}
