// Command democtl is the small toolbox hack/demo.sh runs: a local control plane
// (kube-apiserver and etcd from the envtest binaries, staying up until SIGTERM), a file
// server for the guest image, and the few kubectl-like steps the demo needs (apply the
// sample Proxy, follow it until Ready, print it as `kubectl get px` would, delete it).
//
//	democtl controlplane --dir DIR            # writes DIR/kubeconfig, DIR/*.pid; runs until SIGTERM
//	democtl serve-image --addr A --file F     # serves F at http://A/<basename of F>
//	democtl apply --kubeconfig K -f FILE      # create or update the Proxy in FILE
//	democtl wait --kubeconfig K --name N      # follow the Proxy until Ready, printing progress
//	democtl get --kubeconfig K                # the Proxies, as a table
//	democtl delete --kubeconfig K --name N    # delete the Proxy and wait until it is gone
//	democtl instance-name --name N            # the VM name the operator gives that Proxy
package main

import (
	"flag"
	"fmt"
	"os"
	"time"
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
	manifest := fs.String("f", "", "a Proxy manifest (apply)")
	namespace := fs.String("namespace", "default", "the Proxy's namespace")
	name := fs.String("name", "", "the Proxy's name")
	timeout := fs.Duration("timeout", 30*time.Minute, "how long to wait (wait, delete)")
	_ = fs.Parse(os.Args[2:])

	var err error
	switch os.Args[1] {
	case "controlplane":
		err = runControlPlane(*dir)
	case "serve-image":
		err = serveImage(*addr, *file)
	case "apply":
		err = apply(*kubeconfig, *manifest, *namespace)
	case "wait":
		err = waitReady(*kubeconfig, *namespace, *name, *timeout)
	case "get":
		err = printTable(*kubeconfig)
	case "delete":
		err = deleteProxy(*kubeconfig, *namespace, *name, *timeout)
	case "instance-name":
		fmt.Println(instanceName(*namespace, *name))
	default:
		usage()
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "democtl %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: democtl controlplane|serve-image|apply|wait|get|delete|instance-name [flags]")
	os.Exit(2)
}
