package main

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// A port held by a process is refused before anything starts, naming the part, the
// address, and the pid and command line of the holder (here the test itself).
func TestCheckPortsNamesTheHolder(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	free, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	freeAddr := free.Addr().String()
	_ = free.Close()

	held := ln.Addr().String()
	_, port, _ := net.SplitHostPort(held)
	err = checkPorts([]string{"discovery (DEMO_DISCOVERY_PORT)=" + freeAddr, "metrics (DEMO_METRICS_PORT)=" + held,
		"all addresses=0.0.0.0:" + port})
	if err == nil {
		t.Fatalf("checkPorts passed with %s held", held)
	}
	self, _ := os.Executable()
	for _, want := range []string{
		"metrics (DEMO_METRICS_PORT): " + held + " is taken (address already in use); held by pid " + strconv.Itoa(os.Getpid()) + " (" + self,
		"all addresses: 0.0.0.0:" + port + " is taken",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
	if strings.Contains(err.Error(), "DEMO_DISCOVERY_PORT") {
		t.Errorf("the free address is named as taken:\n%v", err)
	}
	if err := checkPorts([]string{"discovery=" + freeAddr}); err != nil {
		t.Errorf("a free address: %v", err)
	}
	for _, bad := range []string{"127.0.0.1:1", "x=127.0.0.1", "x=127.0.0.1:http", "x=127.0.0.1:70000"} {
		if err := checkPorts([]string{bad}); err == nil {
			t.Errorf("checkPorts(%q) passed", bad)
		}
	}
}

// A manager that exits at once (its port taken) ends the wait at once, with the last
// error line of its log, not after the timeout.
func TestWaitReadyStopsWhenTheManagerExits(t *testing.T) {
	logFile := filepath.Join(t.TempDir(), "manager.log")
	lines := `{"level":"info","msg":"starting manager"}` + "\n" +
		`{"level":"error","logger":"setup","msg":"manager stopped","error":"failed to start metrics server: listen tcp 127.0.0.1:18080: bind: address already in use"}` + "\n" +
		`{"level":"info","msg":"stopping"}` + "\n"
	if err := os.WriteFile(logFile, []byte(lines), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", "exit 1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { _ = cmd.Wait() }()
	closed := httptest.NewServer(http.NotFoundHandler())
	url := closed.URL + "/readyz"
	closed.Close()

	start := time.Now()
	err := waitManagerReady(context.Background(), url, cmd.Process.Pid, logFile, 10*time.Minute, 20*time.Millisecond)
	if err == nil {
		t.Fatal("waitManagerReady returned nil for a manager that exited")
	}
	// It returns at the first poll after the exit; a minute is a generous bound on a
	// loaded machine, far below the ten-minute timeout.
	if d := time.Since(start); d > time.Minute {
		t.Errorf("took %s", d)
	}
	for _, want := range []string{"exited before it was ready", "manager stopped: failed to start metrics server: listen tcp 127.0.0.1:18080: bind: address already in use"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error does not say %q:\n%v", want, err)
		}
	}
}

// Ready when the URL answers 200; a timeout names the last answer and the log's error.
func TestWaitReadyReadyAndTimeout(t *testing.T) {
	var n atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if n.Add(1) < 3 {
			http.Error(w, "[-]caches failed", http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	logFile := filepath.Join(t.TempDir(), "manager.log")
	if err := os.WriteFile(logFile, []byte("read providers config: open /x.yaml: no such file or directory\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := waitManagerReady(context.Background(), srv.URL, os.Getpid(), logFile, time.Minute, 10*time.Millisecond); err != nil {
		t.Fatal(err)
	}
	n.Store(-1 << 30) // never 200 again
	err := waitManagerReady(context.Background(), srv.URL, os.Getpid(), logFile, 100*time.Millisecond, 10*time.Millisecond)
	if err == nil || !strings.Contains(err.Error(), "500 Internal Server Error") || !strings.Contains(err.Error(), "open /x.yaml: no such file") {
		t.Errorf("timeout error: %v", err)
	}
}

func TestProcNetIP(t *testing.T) {
	for h, want := range map[string]string{
		"0300007F":                         "127.0.0.3",
		"00000000":                         "0.0.0.0",
		"00000000000000000000000001000000": "::1",
		"B80D0120000000000000000001000000": "2001:db8::1",
		"7F":                               "<nil>",
		"ZZ00007F":                         "<nil>",
	} {
		if got := procNetIP(h).String(); got != want {
			t.Errorf("procNetIP(%q) = %s, want %s", h, got, want)
		}
	}
}
