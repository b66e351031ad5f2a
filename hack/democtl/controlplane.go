package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// runControlPlane starts kube-apiserver and etcd (KUBEBUILDER_ASSETS) with the project's
// CRDs, writes an admin kubeconfig and the two processes' pid files into dir, and keeps
// them running until SIGTERM or SIGINT. Meanwhile every Proxy the cluster holds is added
// to the record at recordPath every couple of seconds (when recordPath is set), so that
// down can find their domains even after the API server has gone.
func runControlPlane(dir, recordPath string) error {
	if dir == "" {
		return errors.New("--dir is required")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		return errors.New("KUBEBUILDER_ASSETS is not set (KUBEBUILDER_ASSETS=$(hack/envtest-assets.sh))")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	env := &envtest.Environment{
		CRDDirectoryPaths:     []string{filepath.Join("config", "crd", "bases")},
		ErrorIfCRDPathMissing: true,
	}
	if _, err := env.Start(); err != nil {
		return fmt.Errorf("starting kube-apiserver and etcd: %w", err)
	}
	defer func() {
		if err := env.Stop(); err != nil {
			fmt.Fprintf(os.Stderr, "stopping the control plane: %v\n", err)
		}
		for _, f := range []string{"kubeconfig", "etcd.pid", "kube-apiserver.pid"} {
			_ = os.Remove(filepath.Join(dir, f))
		}
	}()
	user, err := env.AddUser(envtest.User{Name: "demo-admin", Groups: []string{"system:masters"}}, nil)
	if err != nil {
		return fmt.Errorf("adding the admin user: %w", err)
	}
	kc, err := user.KubeConfig()
	if err != nil {
		return err
	}
	pids, err := childPids("etcd", "kube-apiserver")
	if err != nil {
		return err
	}
	for f, pid := range pids {
		if err := os.WriteFile(filepath.Join(dir, f), []byte(strconv.Itoa(pid)+"\n"), 0o644); err != nil {
			return err
		}
	}
	// Written last and moved into place: its presence means the control plane is up.
	tmp := filepath.Join(dir, ".kubeconfig.tmp")
	if err := os.WriteFile(tmp, kc, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "kubeconfig")); err != nil {
		return err
	}
	fmt.Printf("control plane up at %s (etcd pid %d, kube-apiserver pid %d)\n",
		env.Config.Host, pids["etcd.pid"], pids["kube-apiserver.pid"])
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if recordPath != "" {
		c, err := client.New(env.Config, client.Options{Scheme: proxyScheme()})
		if err != nil {
			return fmt.Errorf("a client for the record: %w", err)
		}
		go keepRecord(ctx, c, recordPath, 2*time.Second, os.Stderr)
	}
	<-ctx.Done()
	fmt.Println("stopping the control plane")
	return nil
}

// childPids finds this process's children by command name and returns their pids keyed
// by "<name>.pid", so a teardown can check that exactly they are gone.
func childPids(names ...string) (map[string]int, error) {
	tasks, _ := filepath.Glob("/proc/self/task/*/children")
	pids := map[string]int{}
	for _, f := range tasks {
		data, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for _, field := range strings.Fields(string(data)) {
			comm, err := os.ReadFile("/proc/" + field + "/comm")
			if err != nil {
				continue
			}
			pid, _ := strconv.Atoi(field)
			pids[strings.TrimSpace(string(comm))+".pid"] = pid
		}
	}
	want := make(map[string]int, len(names))
	for _, n := range names {
		if pids[n+".pid"] == 0 {
			return nil, fmt.Errorf("no child process %s found in /proc/self/task/*/children", n)
		}
		want[n+".pid"] = pids[n+".pid"]
	}
	return want, nil
}

// serveImage serves file with its Content-Length at /<its base name>.
func serveImage(addr, file string) error {
	if addr == "" || file == "" {
		return errors.New("--addr and --file are required")
	}
	if _, err := os.Stat(file); err != nil {
		return err
	}
	base := "/" + filepath.Base(file)
	mux := http.NewServeMux()
	mux.HandleFunc(base, func(w http.ResponseWriter, r *http.Request) { http.ServeFile(w, r, file) })
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	fmt.Printf("serving %s at http://%s%s\n", file, ln.Addr(), base)
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving on %s: %w", addr, err)
	}
	return nil
}

// shortAge renders an age the way kubectl does (s, m, h, d).
func shortAge(d time.Duration) string {
	switch {
	case d < 2*time.Minute:
		return strconv.Itoa(int(d.Seconds())) + "s"
	case d < 2*time.Hour:
		return strconv.Itoa(int(d.Minutes())) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d.Hours())) + "h"
	}
	return strconv.Itoa(int(d.Hours()/24)) + "d"
}
