package gateway

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"net"
	"net/netip"
	"strconv"
	"time"
)

// SOCKS5 (RFC 1928) with username/password authentication (RFC 1929): the user name
// carries the same options as the HTTP proxy's, the password the same token. Only
// CONNECT is served; the destination may be a domain name, an IPv4 or an IPv6 address.
const (
	socksVersion      = 0x05
	socksAuthVersion  = 0x01
	socksMethodUser   = 0x02
	socksNoMethod     = 0xff
	socksCmdConnect   = 0x01
	socksAtypIPv4     = 0x01
	socksAtypDomain   = 0x03
	socksAtypIPv6     = 0x04
	socksAuthSuccess  = 0x00
	socksAuthRejected = 0x01
)

// serveSOCKSConn runs one SOCKS5 handshake within HeaderTimeout and, when it succeeds,
// turns the connection into a tunnel. A refusal can carry no text in SOCKS5: its reason
// is logged.
func (g *Gateway) serveSOCKSConn(cc *clientConn) {
	c := cc.c
	c.SetDeadline(time.Now().Add(g.cfg.HeaderTimeout))
	br := getReader(c)
	defer putReader(br)
	rt, err := g.socksHandshake(c, br)
	if err != nil {
		g.log.V(1).Info("SOCKS5 handshake refused", "client", c.RemoteAddr().String(), "reason", err.Error())
		return
	}
	exitConn, exit, rest, err := g.openTunnel(context.Background(), rt, client{c, br})
	if err != nil {
		r := refuseChoice(rt, err)
		g.count(kindTunnel, rt.namespace, rt.pool, r.outcome)
		g.log.V(1).Info("SOCKS5 tunnel refused", "client", c.RemoteAddr().String(), "reason", r.msg)
		c.Write(socksReply(r.socks, ""))
		return
	}
	g.count(kindTunnel, rt.namespace, rt.pool, rt.outcome()) // before the client sees the answer
	if _, err := c.Write(socksReply(socksSucceeded, exit.EgressIP)); err != nil {
		exitConn.Close()
		return
	}
	c.SetDeadline(time.Time{})
	var early []byte
	if n := br.Buffered(); n > 0 {
		p, _ := br.Peek(n)
		early = append([]byte(nil), p...)
	}
	cc.tunneled = true
	g.startTunnel(c, exitConn, early, rest, rt, exit)
}

// socksHandshake reads the greeting, the credentials and the request. On a refusal it
// has answered the client and returns why.
func (g *Gateway) socksHandshake(c net.Conn, br *bufio.Reader) (*route, error) {
	var b [4]byte
	if _, err := io.ReadFull(br, b[:2]); err != nil {
		return nil, g.socksBad("reading the greeting: %v", err)
	}
	if b[0] != socksVersion {
		return nil, g.socksBad("version %d is not SOCKS5", b[0])
	}
	methods := make([]byte, b[1])
	if _, err := io.ReadFull(br, methods); err != nil {
		return nil, g.socksBad("reading the methods: %v", err)
	}
	offered := false
	for _, m := range methods {
		offered = offered || m == socksMethodUser
	}
	if !offered {
		c.Write([]byte{socksVersion, socksNoMethod})
		g.count(kindTunnel, "", "", outcomeAuthFailed)
		return nil, fmt.Errorf("the client offered no username/password authentication")
	}
	if _, err := c.Write([]byte{socksVersion, socksMethodUser}); err != nil {
		return nil, err
	}
	user, password, err := readSOCKSCredentials(br)
	if err != nil {
		return nil, g.socksBad("reading the credentials: %v", err)
	}
	id, opts, r := g.authenticate(context.Background(), user, password)
	if r != nil {
		g.count(kindTunnel, opts.Namespace, opts.Pool, r.outcome)
		c.Write([]byte{socksAuthVersion, socksAuthRejected})
		return nil, fmt.Errorf("authentication: %s", r.msg)
	}
	if _, err := c.Write([]byte{socksAuthVersion, socksAuthSuccess}); err != nil {
		return nil, err
	}
	if _, err := io.ReadFull(br, b[:4]); err != nil {
		return nil, g.socksBad("reading the request: %v", err)
	}
	if b[1] != socksCmdConnect {
		c.Write(socksReply(socksCmdUnsupported, ""))
		return nil, g.socksBad("command %d is not CONNECT", b[1])
	}
	host, err := readSOCKSAddr(br, b[3])
	if err != nil {
		c.Write(socksReply(socksAddrUnsupported, ""))
		return nil, g.socksBad("reading the destination: %v", err)
	}
	if _, err := io.ReadFull(br, b[:2]); err != nil {
		return nil, g.socksBad("reading the port: %v", err)
	}
	port := binary.BigEndian.Uint16(b[:2])
	return newRoute(id, opts, net.JoinHostPort(host, strconv.Itoa(int(port)))), nil
}

func (g *Gateway) socksBad(format string, args ...any) error {
	g.count(kindTunnel, "", "", outcomeBadRequest)
	return fmt.Errorf(format, args...)
}

func readSOCKSCredentials(br *bufio.Reader) (user, password string, err error) {
	var b [2]byte
	if _, err := io.ReadFull(br, b[:2]); err != nil {
		return "", "", err
	}
	if b[0] != socksAuthVersion {
		return "", "", fmt.Errorf("username/password version %d is not 1", b[0])
	}
	u := make([]byte, b[1])
	if _, err := io.ReadFull(br, u); err != nil {
		return "", "", err
	}
	if _, err := io.ReadFull(br, b[:1]); err != nil {
		return "", "", err
	}
	p := make([]byte, b[0])
	if _, err := io.ReadFull(br, p); err != nil {
		return "", "", err
	}
	return string(u), string(p), nil
}

func readSOCKSAddr(br *bufio.Reader, atyp byte) (string, error) {
	switch atyp {
	case socksAtypIPv4:
		var a [4]byte
		if _, err := io.ReadFull(br, a[:]); err != nil {
			return "", err
		}
		return netip.AddrFrom4(a).String(), nil
	case socksAtypIPv6:
		var a [16]byte
		if _, err := io.ReadFull(br, a[:]); err != nil {
			return "", err
		}
		return netip.AddrFrom16(a).String(), nil
	case socksAtypDomain:
		n, err := br.ReadByte()
		if err != nil {
			return "", err
		}
		name := make([]byte, n)
		if _, err := io.ReadFull(br, name); err != nil {
			return "", err
		}
		if n == 0 {
			return "", fmt.Errorf("empty domain name")
		}
		return string(name), nil
	default:
		return "", fmt.Errorf("address type %d is not IPv4, IPv6 or a domain name", atyp)
	}
}

// socksReply is a reply with the given code. On success its bound address is the exit's
// egress address when known (the address the site sees, as BND.ADDR is meant to be), so
// a SOCKS5 client can learn it; otherwise 0.0.0.0:0.
func socksReply(code byte, egressIP string) []byte {
	out := []byte{socksVersion, code, 0x00}
	addr, err := netip.ParseAddr(egressIP)
	switch {
	case err == nil && addr.Is4():
		a := addr.As4()
		out = append(append(out, socksAtypIPv4), a[:]...)
	case err == nil:
		a := addr.As16()
		out = append(append(out, socksAtypIPv6), a[:]...)
	default:
		out = append(out, socksAtypIPv4, 0, 0, 0, 0)
	}
	return append(out, 0, 0)
}
