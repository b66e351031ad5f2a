package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

func newClient(kubeconfig string) (client.Client, error) {
	if kubeconfig == "" {
		return nil, errors.New("--kubeconfig is required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	scheme := runtime.NewScheme()
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return client.New(cfg, client.Options{Scheme: scheme})
}

// apply creates the Proxy in file, or updates its spec when it exists.
func apply(kubeconfig, file, namespace string) error {
	c, err := newClient(kubeconfig)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	var px v1alpha1.Proxy
	if err := yaml.UnmarshalStrict(data, &px); err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	if px.Namespace == "" {
		px.Namespace = namespace
	}
	ctx := context.Background()
	var cur v1alpha1.Proxy
	err = c.Get(ctx, client.ObjectKeyFromObject(&px), &cur)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, &px); err != nil {
			return err
		}
		fmt.Printf("proxy.egress.hrajfrisbee.cz/%s created\n", px.Name)
	case err != nil:
		return err
	default:
		cur.Spec = px.Spec
		if err := c.Update(ctx, &cur); err != nil {
			return err
		}
		fmt.Printf("proxy.egress.hrajfrisbee.cz/%s configured\n", px.Name)
	}
	return nil
}

// waitReady prints the Proxy's phase and Provisioned message whenever they change, until
// it is Ready (exit 0), Failed (an error) or timeout passes.
func waitReady(kubeconfig, namespace, name string, timeout time.Duration) error {
	c, err := newClient(kubeconfig)
	if err != nil {
		return err
	}
	start := time.Now()
	last := ""
	for {
		var px v1alpha1.Proxy
		err := c.Get(context.Background(), client.ObjectKey{Namespace: namespace, Name: name}, &px)
		line := ""
		if err != nil {
			line = err.Error()
		} else {
			line = fmt.Sprintf("%-12s %s", px.Status.Phase, statusMessage(&px))
		}
		if line != last {
			fmt.Printf("  [%4ds] %s\n", int(time.Since(start).Seconds()), line)
			last = line
		}
		if err == nil && px.Status.Phase == v1alpha1.PhaseReady {
			return nil
		}
		if err == nil && px.Status.Phase == v1alpha1.PhaseFailed {
			return fmt.Errorf("proxy %s/%s failed: %s", namespace, name, px.Status.Message)
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("proxy %s/%s not Ready after %s (last: %s)", namespace, name, timeout, line)
		}
		time.Sleep(time.Second)
	}
}

// statusMessage is what a user wants to read while waiting: the Provisioned condition's
// message until the VM runs, then the Healthy condition's.
func statusMessage(px *v1alpha1.Proxy) string {
	if px.Status.Phase == v1alpha1.PhaseRunning || px.Status.Phase == v1alpha1.PhaseReady {
		if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionHealthy); c != nil {
			return c.Message
		}
		return "waiting for the first probe through the proxy"
	}
	if c := meta.FindStatusCondition(px.Status.Conditions, v1alpha1.ConditionProvisioned); c != nil {
		return c.Message
	}
	return px.Status.Message
}

// printTable prints every Proxy with the columns of `kubectl get px`.
func printTable(kubeconfig string) error {
	c, err := newClient(kubeconfig)
	if err != nil {
		return err
	}
	var list v1alpha1.ProxyList
	if err := c.List(context.Background(), &list); err != nil {
		return err
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 8, 3, ' ', 0)
	fmt.Fprintln(w, "NAMESPACE\tNAME\tMODE\tPROVIDER\tPHASE\tIP\tHEALTHY\tAGE")
	for _, px := range list.Items {
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", px.Namespace, px.Name, px.Spec.Mode, px.Spec.Provider,
			px.Status.Phase, px.Status.IP, strconv.FormatBool(px.Status.Healthy), shortAge(time.Since(px.CreationTimestamp.Time)))
	}
	return w.Flush()
}

// deleteProxy deletes the Proxy and waits until the operator has removed its VM and
// released the finalizer.
func deleteProxy(kubeconfig, namespace, name string, timeout time.Duration) error {
	c, err := newClient(kubeconfig)
	if err != nil {
		return err
	}
	ctx := context.Background()
	px := &v1alpha1.Proxy{}
	px.Namespace, px.Name = namespace, name
	if err := c.Delete(ctx, px); apierrors.IsNotFound(err) {
		return nil
	} else if err != nil {
		return err
	}
	start := time.Now()
	for {
		err := c.Get(ctx, client.ObjectKeyFromObject(px), px)
		if apierrors.IsNotFound(err) {
			fmt.Printf("proxy %s/%s deleted (its VM with it) in %s\n", namespace, name, time.Since(start).Round(time.Second))
			return nil
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("proxy %s/%s still there after %s: %s", namespace, name, timeout, px.Status.Message)
		}
		time.Sleep(time.Second)
	}
}

// instanceName is v1alpha1.Proxy.InstanceName for a Proxy that may no longer exist.
func instanceName(namespace, name string) string {
	sum := sha256.Sum256([]byte(namespace + "/" + name))
	return "proxy-" + hex.EncodeToString(sum[:])[:16]
}
