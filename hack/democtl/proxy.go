package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime"
	utilruntime "k8s.io/apimachinery/pkg/util/runtime"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/manifest"
)

func newClient(kubeconfig string) (client.Client, error) {
	if kubeconfig == "" {
		return nil, errors.New("--kubeconfig is required")
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", kubeconfig)
	if err != nil {
		return nil, fmt.Errorf("loading %s: %w", kubeconfig, err)
	}
	// A dead API server refuses at once; a hung one must not hold down forever.
	cfg.Timeout = 20 * time.Second
	return client.New(cfg, client.Options{Scheme: proxyScheme()})
}

// proxyScheme knows the project's types.
func proxyScheme() *runtime.Scheme {
	scheme := runtime.NewScheme()
	utilruntime.Must(v1alpha1.AddToScheme(scheme))
	utilruntime.Must(corev1.AddToScheme(scheme))
	return scheme
}

// apply creates each object of file (the Proxies and the Secrets they name), or updates
// it when it exists: a Proxy's spec, a Secret's data.
func apply(kubeconfig, file, namespace string) error {
	c, err := newClient(kubeconfig)
	if err != nil {
		return err
	}
	data, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	objs, err := manifest.Decode(data)
	if err != nil {
		return fmt.Errorf("%s: %w", file, err)
	}
	ctx := context.Background()
	for _, obj := range objs {
		if obj.GetNamespace() == "" {
			obj.SetNamespace(namespace)
		}
		if err := applyOne(ctx, c, obj); err != nil {
			return err
		}
	}
	return nil
}

func applyOne(ctx context.Context, c client.Client, obj client.Object) error {
	kind := "proxy.egress.hrajfrisbee.cz"
	if _, ok := obj.(*corev1.Secret); ok {
		kind = "secret"
	}
	cur := obj.DeepCopyObject().(client.Object)
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), cur)
	switch {
	case apierrors.IsNotFound(err):
		if err := c.Create(ctx, obj); err != nil {
			return err
		}
		fmt.Printf("%s/%s created\n", kind, obj.GetName())
		return nil
	case err != nil:
		return err
	}
	switch o := obj.(type) {
	case *v1alpha1.Proxy:
		cur.(*v1alpha1.Proxy).Spec = o.Spec
	case *corev1.Secret:
		cur.(*corev1.Secret).Data, cur.(*corev1.Secret).StringData = o.Data, o.StringData
	}
	if err := c.Update(ctx, cur); err != nil {
		return err
	}
	fmt.Printf("%s/%s configured\n", kind, obj.GetName())
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
