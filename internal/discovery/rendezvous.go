package discovery

// Rendezvous (highest random weight) hashing: every proxy scores every key, the highest
// score wins. The same key picks the same proxy for as long as that proxy stays in the
// set, and removing a proxy moves only the keys it was winning, spread evenly over the
// rest; adding one takes about 1/n of the keys, from every other proxy alike.
//
// Sites judge a proxy by the address it leaves from, so pick hashes in two rounds: a key
// first chooses an egress identity (the address the health probe saw, status.egressIP),
// then one of the proxies sharing it. Keys spread evenly over distinct addresses, however
// many VMs stand behind each; removing one of two proxies on an address moves its keys to
// the other, never to another address. A proxy whose egress address is not known is an
// identity of its own, seeded by its namespace/name exactly as a proxy is in the second
// round (an address never contains the "/"), so without known addresses pick chooses as
// plain one-round rendezvous does.

const (
	fnvOffset64 = 14695981039346656037
	fnvPrime64  = 1099511628211
)

// hashString is FNV-1a over s. It is the seed of a key or of a proxy's identity.
func hashString(s string) uint64 {
	h := uint64(fnvOffset64)
	for i := 0; i < len(s); i++ {
		h ^= uint64(s[i])
		h *= fnvPrime64
	}
	return h
}

// mix is the splitmix64 finaliser. FNV alone distributes similar strings (proxy-01,
// proxy-02, ...) poorly in the high bits; mixing the combined seeds fixes that.
func mix(x uint64) uint64 {
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// nodeSeed is a proxy's fixed contribution to every score, computed once per snapshot.
func nodeSeed(id string) uint64 { return mix(hashString(id)) }

// score is the weight of the proxy seeded node for the key seeded key.
func score(key, node uint64) uint64 { return mix(key ^ node) }
