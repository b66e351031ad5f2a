package kube

import (
	"context"
	"fmt"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	toolscache "k8s.io/client-go/tools/cache"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/access"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/bans"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/discovery"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// Options configure Setup.
type Options struct {
	// TokenFile holds the static discovery token (--discovery-token-file); empty: none.
	TokenFile string
	// KubernetesAuth accepts Kubernetes tokens by TokenReview and SubjectAccessReview
	// (--discovery-kubernetes-auth).
	KubernetesAuth bool
	// MaxCoolingPercent is the saturation threshold (default bans.DefaultMaxCoolingPercent).
	MaxCoolingPercent int
}

// CacheByObject restricts the Secrets a gateway's cache holds to those opted in as proxy
// credentials (v1alpha1.CredentialsLabel "true"), as the manager's does: the credential
// snapshots the gateway hands to exits are among them, and no other Secret's data
// reaches the gateway.
func CacheByObject() map[client.Object]cache.ByObject {
	return map[client.Object]cache.ByObject{
		&corev1.Secret{}: {Label: labels.SelectorFromSet(labels.Set{v1alpha1.CredentialsLabel: "true"})},
	}
}

// Setup builds, over mgr's cache, what the manager's discovery API is built of: the
// Proxy snapshot source, the token checks (static token, Kubernetes access with its
// bounded caches), the credentials of each Proxy's snapshot Secret, the pools' ban
// settings and the feedback recorder (added to mgr); and returns the Adapter over them.
// The server it builds serves no HTTP: the gateway calls it.
func Setup(ctx context.Context, mgr ctrl.Manager, opts Options) (*Adapter, error) {
	if opts.TokenFile == "" && !opts.KubernetesAuth {
		return nil, fmt.Errorf("the gateway needs a way to check its callers' tokens: give --discovery-token-file or --discovery-kubernetes-auth")
	}
	src, err := discovery.NewCacheSource(ctx, mgr.GetCache())
	if err != nil {
		return nil, err
	}
	rec := &bans.Recorder{Client: mgr.GetClient(), Reader: mgr.GetClient(), APIReader: mgr.GetAPIReader(),
		Policy: bans.DefaultPolicy, Log: ctrl.Log.WithName("feedback")}
	if err := mgr.Add(rec); err != nil {
		return nil, fmt.Errorf("adding the feedback recorder: %w", err)
	}
	var acc *access.Access
	if opts.KubernetesAuth {
		acc = access.New(access.ClientReviewer{Client: mgr.GetClient()}, access.Options{})
	}
	srv, err := discovery.New(src, discovery.Options{
		TokenFile:         opts.TokenFile,
		Access:            acc,
		Credentials:       proxyconfig.SnapshotCredentials{Reader: mgr.GetClient(), Metadata: mgr.GetAPIReader()}.Credentials,
		Feedback:          rec,
		MaxCoolingPercent: opts.MaxCoolingPercent,
		PoolBans:          discovery.PoolBansFrom(mgr.GetClient()),
		Log:               ctrl.Log.WithName("gateway-discovery"),
	})
	if err != nil {
		return nil, err
	}
	rec.BeforeFinalFlush = srv.Drain
	if err := mgr.Add(tokenWatcher{srv}); err != nil {
		return nil, err
	}
	a := &Adapter{Server: srv, Pools: mgr.GetCache(), Log: ctrl.Log.WithName("gateway")}
	// Held requests choose again on every change of the exits: a Proxy change that makes a
	// new snapshot (called once the snapshot sees it), and any ProxyPool event.
	src.OnChange(a.changed)
	pools, err := mgr.GetCache().GetInformer(ctx, &v1alpha1.ProxyPool{})
	if err != nil {
		return nil, fmt.Errorf("getting the proxypool informer: %w", err)
	}
	if _, err := pools.AddEventHandler(toolscache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { a.changed() },
		UpdateFunc: func(any, any) { a.changed() },
		DeleteFunc: func(any) { a.changed() },
	}); err != nil {
		return nil, fmt.Errorf("watching proxypools: %w", err)
	}
	return a, nil
}

// WakeOn makes fn be called whenever the exits may have changed (the gateway's
// ExitsChanged, which wakes its held requests). fn must not block.
func (a *Adapter) WakeOn(fn func()) { a.wake.Store(&fn) }

func (a *Adapter) changed() {
	if fn := a.wake.Load(); fn != nil {
		(*fn)()
	}
}

// tokenWatcher re-reads the static token file while the manager runs.
type tokenWatcher struct{ srv *discovery.Server }

func (w tokenWatcher) Start(ctx context.Context) error {
	w.srv.WatchTokenFile(ctx)
	<-ctx.Done()
	return nil
}

func (tokenWatcher) NeedLeaderElection() bool { return false }
