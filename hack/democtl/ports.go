package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// checkPorts checks, before the demo starts anything, that each address it is about to
// listen on is free. Each spec is "WHAT=HOST:PORT" (WHAT names the part and the variable
// that chooses its port, as the demo prints it). It fails naming every address taken,
// each with the process holding it (pid and command line, from /proc) when it can be
// found.
func checkPorts(specs []string) error {
	var taken []string
	for _, spec := range specs {
		what, addr, ok := strings.Cut(spec, "=")
		if !ok || what == "" {
			return fmt.Errorf("port spec %q: want WHAT=HOST:PORT", spec)
		}
		host, portStr, err := net.SplitHostPort(addr)
		if err != nil {
			return fmt.Errorf("%s: address %q: %w", what, addr, err)
		}
		port, err := strconv.Atoi(portStr)
		if err != nil || port < 1 || port > 65535 {
			return fmt.Errorf("%s: port %q of %s is not a number from 1 to 65535", what, portStr, addr)
		}
		ln, err := net.Listen("tcp", addr)
		if err == nil {
			_ = ln.Close()
			continue
		}
		taken = append(taken, fmt.Sprintf("%s: %s is taken (%v); held by %s", what, addr, unwrapSyscall(err), portHolder(host, port)))
	}
	if len(taken) > 0 {
		return fmt.Errorf("ports the demo needs are in use; stop what holds them, or choose other ports:\n  %s", strings.Join(taken, "\n  "))
	}
	return nil
}

// unwrapSyscall shortens "listen tcp 127.0.0.1:1: bind: address already in use" to its cause.
func unwrapSyscall(err error) error {
	var se *os.SyscallError
	if errors.As(err, &se) {
		return se.Err
	}
	return err
}

// portHolder names the process listening on port (on host or on every address), from
// /proc/net/tcp{,6} and the sockets in /proc/*/fd.
func portHolder(host string, port int) string {
	inodes := listeningInodes(net.ParseIP(host), port)
	if len(inodes) == 0 {
		return fmt.Sprintf("no listener this process can see (look with: ss -ltnp 'sport = :%d')", port)
	}
	procs, _ := filepath.Glob("/proc/[0-9]*/fd/*")
	for _, fd := range procs {
		target, err := os.Readlink(fd)
		if err != nil || !strings.HasPrefix(target, "socket:[") {
			continue
		}
		if !inodes[strings.TrimSuffix(strings.TrimPrefix(target, "socket:["), "]")] {
			continue
		}
		pid := strings.Split(fd, "/")[2]
		cmd, _ := os.ReadFile("/proc/" + pid + "/cmdline")
		line := strings.TrimSpace(strings.ReplaceAll(string(cmd), "\x00", " "))
		if line == "" {
			comm, _ := os.ReadFile("/proc/" + pid + "/comm")
			line = strings.TrimSpace(string(comm))
		}
		return fmt.Sprintf("pid %s (%s)", pid, line)
	}
	return fmt.Sprintf("a process this user cannot see (look with: ss -ltnp 'sport = :%d')", port)
}

// listeningInodes are the socket inodes listening on TCP port, IPv4 and IPv6, at host or
// at an address that takes in host (every address, 0.0.0.0 or ::). A nil host (a name)
// matches any address.
func listeningInodes(host net.IP, port int) map[string]bool {
	inodes := map[string]bool{}
	want := fmt.Sprintf(":%04X", port)
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		file, err := os.Open(f)
		if err != nil {
			continue
		}
		sc := bufio.NewScanner(file)
		for sc.Scan() {
			// sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout inode
			fields := strings.Fields(sc.Text())
			if len(fields) < 10 || !strings.HasSuffix(fields[1], want) || fields[3] != "0A" {
				continue
			}
			if ip := procNetIP(strings.TrimSuffix(fields[1], want)); host != nil && ip != nil &&
				!ip.IsUnspecified() && !host.IsUnspecified() && !ip.Equal(host) {
				continue
			}
			inodes[fields[9]] = true
		}
		_ = file.Close()
	}
	return inodes
}

// waitManagerReady polls url until it answers 200 and returns nil then. It stops at once
// when the process pid exits, with an error carrying the last error line of its log, and
// when timeout passes.
func waitManagerReady(ctx context.Context, url string, pid int, logFile string, timeout, poll time.Duration) error {
	deadline := time.Now().Add(timeout)
	hc := &http.Client{Timeout: 5 * time.Second}
	last := ""
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		res, err := hc.Do(req)
		if err == nil {
			_ = res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return nil
			}
			last = res.Status
		} else {
			last = err.Error()
		}
		if processGone(pid) {
			return fmt.Errorf("the manager (pid %d) exited before it was ready; the last error in %s:\n  %s", pid, logFile, lastErrorLine(logFile))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the manager (pid %d) is not ready after %s (%s answered: %s); the last error in %s:\n  %s", pid, timeout, url, last, logFile, lastErrorLine(logFile))
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(poll):
		}
	}
}

// lastErrorLine is the last line of the log at path that reports an error: a JSON line of
// level error (shown as its message and error), or a plain line mentioning an error; else
// the last line.
func lastErrorLine(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return fmt.Sprintf("(cannot read the log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		line := strings.TrimSpace(lines[i])
		var entry struct {
			Level string `json:"level"`
			Msg   string `json:"msg"`
			Error string `json:"error"`
		}
		if json.Unmarshal([]byte(line), &entry) == nil && entry.Level != "" {
			if entry.Level == "error" {
				return strings.TrimSuffix(entry.Msg+": "+entry.Error, ": ")
			}
			continue
		}
		if strings.Contains(strings.ToLower(line), "error") {
			return line
		}
	}
	if last := strings.TrimSpace(lines[len(lines)-1]); last != "" {
		return last
	}
	return "(the log is empty)"
}

// procNetIP decodes an address of /proc/net/tcp{,6}: 8 or 32 hex digits, each group of 4
// bytes in the host's (little-endian) order. Anything else is nil.
func procNetIP(h string) net.IP {
	if len(h) != 8 && len(h) != 32 {
		return nil
	}
	ip := make(net.IP, len(h)/2)
	for i := 0; i < len(ip); i += 4 {
		for j := range 4 {
			b, err := strconv.ParseUint(h[2*(i+j):2*(i+j)+2], 16, 8)
			if err != nil {
				return nil
			}
			ip[i+3-j] = byte(b)
		}
	}
	return ip
}
