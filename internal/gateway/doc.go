// Package gateway is the data plane of the one-URL gateway: a crawler points any HTTP
// proxy setting (or a SOCKS5 one) at it, puts its options in the proxy user name and a
// discovery token in the password, and the gateway sends each request or tunnel through
// an exit (one of the farm's forward proxies) that it chooses per request or per session.
// It never intercepts TLS: an HTTPS request is a CONNECT tunnel whose bytes it only pumps.
//
// The package holds no selection logic and no Kubernetes client. It reaches the rest of
// the operator through three interfaces, so that the binary (cmd/gateway) wires them to
// discovery's selection code and caches (package gateway/kube does):
//
//   - Chooser chooses one exit for a ChoiceRequest (the caller's Identity, namespace,
//     pool, session key, strictness, rotation counter, target site, exits to exclude, IP
//     family). Sessions map to exits by rendezvous over the session key, so every replica
//     sends a session to the same exit with no shared state; without a session the
//     gateway passes a rotation counter and the Chooser takes the next distinct egress
//     address.
//   - Authenticator turns the proxy password into an Identity: who it is and which
//     namespaces it may use. The gateway checks every exit a Chooser returns against it.
//   - Reporter hears of exits that failed (refused, timed out, or answered with their own
//     failure) and of plain-HTTP answers that mean banned or throttled.
//
// Requests. One listener (Serve) takes HTTP/1.1: absolute-URI requests are forwarded
// through the exit with http.Transport (connections to each exit kept alive, hop-by-hop
// headers dropped both ways, the client's Proxy-Authorization replaced by the exit's own
// credentials), and CONNECT opens a tunnel by a CONNECT of the gateway's own to the exit.
// Another listener (ServeSOCKS) takes SOCKS5 CONNECT with username/password. Both read
// the same user-name options (ParseOptions) and share the Chooser and Authenticator.
// The header is read by the gateway itself, not net/http's server, so that a slow
// header gets a 408 and a large one a 431 with a body that says which limit was hit.
//
// Retries. Before any byte of an answer has reached the client, a failed exit (its
// connection refused or timed out, a non-2xx answer to the gateway's CONNECT, or for
// plain HTTP a 5xx that ExitGenerated says the exit proxy made itself) is reported and
// excluded, and the next exit is chosen, up to Config.MaxAttempts exits in all. A plain
// request with a body is not retried: the gateway keeps no copy of bodies. A strict
// session is never moved: its exit's failure is the client's 502, naming the exit.
//
// Tunnels. Once the exit answers 200, the handler's goroutine ends and two fresh ones
// pump the bytes, one each way, through TCPConn.ReadFrom, which splices in the kernel
// (the path io.Copy between TCP connections takes). Each direction waits for its socket
// to be readable before taking a splice pipe, so an idle tunnel holds its two sockets and
// two small parked goroutines and nothing else; header buffers come from a pool and go
// back before the pumping starts. The end of one direction half-closes the other side;
// an error closes both.
//
// Holding. A request naming a pool that exists but has no eligible exit yet (the
// Chooser's *EmptyPoolError) is held, before any exit was tried, for up to
// Config.ActivationTimeout: it counts as the pool's held demand (the DemandRecorder hears
// of it at once, which wakes a pool at zero), and it asks the Chooser again each time
// ExitsChanged is called (the binary calls it from its informers' events; nothing
// polls). It is served through the first exit offered, or answered 503 with Retry-After
// on the timeout or beyond Config.MaxHeldPerPool held for the pool; a client going away
// ends it. MeasureDemand and RunDemand measure each pool's demand (open tunnels plus live
// sessions, held requests, requests per second) for the DemandRecorder.
//
// Draining. Shutdown closes the listeners, wakes idle keep-alive connections so they
// close, answers held requests 503, lets requests in flight and open tunnels finish until
// its context ends, then closes what is left; each step is logged.
package gateway
