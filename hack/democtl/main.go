// Command democtl is the small toolbox hack/demo.sh runs: a local control plane
// (kube-apiserver and etcd from the envtest binaries, staying up until SIGTERM, keeping a
// record of every Proxy it holds), a file server for the guest image, the few kubectl-like
// steps the demo needs (apply the sample Proxy, follow it until Ready, print the Proxies as
// `kubectl get px` would), and the two steps of its teardown.
//
//	democtl controlplane --dir DIR --record R  # writes DIR/kubeconfig, DIR/*.pid; runs until SIGTERM
//	democtl serve-image --addr A --file F      # serves F at http://A/<basename of F>
//	democtl apply --kubeconfig K -f FILE       # create or update the Proxies and Secrets in FILE
//	democtl wait --kubeconfig K --name N       # follow the Proxy until Ready, printing progress
//	democtl get --kubeconfig K                 # the Proxies, as a table
//	democtl delete-all --kubeconfig K --record R [--manager-pid P]
//	                                           # record and delete every Proxy; with the manager's pid follow them until gone
//	democtl sweep --providers-config P --record R [--kubeconfig K]
//	                                           # remove the recorded Proxies' domains left on the host
//	democtl check-ports WHAT=HOST:PORT...      # fail naming each address in use and the process holding it
//	democtl wait-ready --url U --pid P --log L # wait for U to answer 200; stop at once when P exits, with L's last error
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"

	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/provider/kvm2"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	fs := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	dir := fs.String("dir", "", "state directory (controlplane)")
	addr := fs.String("addr", "", "listen address (serve-image)")
	file := fs.String("file", "", "the file to serve (serve-image)")
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the control plane")
	manifest := fs.String("f", "", "a manifest of Proxies and Secrets (apply)")
	namespace := fs.String("namespace", "default", "the Proxy's namespace")
	name := fs.String("name", "", "the Proxy's name")
	timeout := fs.Duration("timeout", 30*time.Minute, "how long to wait (wait, delete-all, wait-ready)")
	recordPath := fs.String("record", "", "the record of the cluster's Proxies (controlplane, delete-all, sweep)")
	managerPid := fs.Int("manager-pid", 0, "the running manager's pid: follow the deleted Proxies until they are gone or it exits (delete-all)")
	providersConfig := fs.String("providers-config", "", "the manager's providers config (sweep)")
	url := fs.String("url", "", "the readiness URL (wait-ready)")
	pid := fs.Int("pid", 0, "the manager's pid (wait-ready)")
	logFile := fs.String("log", "", "the manager's log (wait-ready)")
	_ = fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "controlplane":
		err = runControlPlane(*dir, *recordPath)
	case "serve-image":
		err = serveImage(*addr, *file)
	case "apply":
		err = apply(*kubeconfig, *manifest, *namespace)
	case "wait":
		err = waitReady(*kubeconfig, *namespace, *name, *timeout)
	case "get":
		err = printTable(*kubeconfig)
	case "delete-all":
		err = runDeleteAll(*kubeconfig, *recordPath, *managerPid, *timeout)
	case "sweep":
		err = runSweep(*providersConfig, *recordPath, *kubeconfig)
	case "check-ports":
		err = checkPorts(fs.Args())
	case "wait-ready":
		if *url == "" || *pid == 0 || *logFile == "" {
			err = fmt.Errorf("--url, --pid and --log are required")
			break
		}
		err = waitManagerReady(context.Background(), *url, *pid, *logFile, *timeout, 200*time.Millisecond)
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "democtl %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func runDeleteAll(kubeconfig, recordPath string, managerPid int, timeout time.Duration) error {
	if recordPath == "" {
		return fmt.Errorf("--record is required")
	}
	c, err := newClient(kubeconfig)
	if err != nil {
		return err
	}
	return deleteAll(context.Background(), c, recordPath, managerPid, timeout, time.Second, os.Stdout)
}

// runSweep builds the kvm2 provider of the demo's providers config (its one entry) and
// sweeps with it. A kubeconfig that is missing or whose API server does not answer leaves
// the Proxies' objects alone.
func runSweep(providersConfig, recordPath, kubeconfig string) error {
	if providersConfig == "" || recordPath == "" {
		return fmt.Errorf("--providers-config and --record are required")
	}
	cfg, err := provider.LoadConfig(providersConfig)
	if err != nil {
		return err
	}
	if len(cfg.Providers) != 1 || cfg.Providers[0].Type != provider.TypeKVM2 {
		return fmt.Errorf("%s: want exactly one provider, of type %s, as the demo writes it", providersConfig, provider.TypeKVM2)
	}
	pc := cfg.Providers[0]
	p, err := kvm2.New(pc, logr.Discard())
	if err != nil {
		return err
	}
	defer func() { _ = p.Close() }()
	s := &sweeper{prov: p, record: recordPath, pools: map[string]string{}, out: os.Stdout}
	for _, h := range pc.KVM2.WithDefaults().Hosts {
		s.pools[h.Name] = h.Pool
	}
	if _, err := os.Stat(kubeconfig); kubeconfig != "" && err == nil {
		if s.c, err = newClient(kubeconfig); err != nil {
			return err
		}
	}
	return s.sweep(context.Background())
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: democtl controlplane|serve-image|apply|wait|get|delete-all|sweep|check-ports|wait-ready [flags]")
	os.Exit(2)
}
