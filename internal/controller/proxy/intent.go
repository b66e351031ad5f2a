package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"

	"k8s.io/apimachinery/pkg/api/meta"
	"sigs.k8s.io/controller-runtime/pkg/event"
	"sigs.k8s.io/controller-runtime/pkg/predicate"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/controller/common"
	"gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/internal/proxyconfig"
)

// A Proxy's instance is judged by two hashes. The intent hash (status.specHash) covers
// what the user asked for: a new one means the user changed the spec or rotated the
// password. The rendered hash (status.renderedHash, and the provider's mark) covers what
// this operator version builds from it: a new one alone means the operator was upgraded
// to a release that renders the same intent differently, which replaces nothing by
// itself.

// hashes are the two hashes of a Proxy as this operator version sees it now.
type hashes struct {
	intent, rendered string
}

// intentInput is what the intent hash of a Managed Proxy with spec.proxy covers. It
// embeds spec.proxy whole (intentProxy), so a field added to v1alpha1.ProxyConfig is
// covered without a change here. Embedded, its fields sit beside port in the JSON, and
// those left unset are left out (omitempty): a Proxy that sets only the fields the hash
// covered before it embedded spec.proxy (port, source ranges, credentials, WireGuard)
// hashes as it did then, and a field added later keeps the hash of every Proxy that does
// not set it. A field of ProxyConfig must therefore be omitempty, and must not share a
// JSON name with the fields below (the outer one would hide it);
// TestIntentCoversEveryProxyConfigField and TestIntentHashKeptForUnchangedProxies fail
// otherwise.
type intentInput struct {
	Provider  string                  `json:"provider"`
	Placement v1alpha1.ProxyPlacement `json:"placement"`
	CloudInit string                  `json:"cloudInit"`
	Port      int32                   `json:"port"`
	v1alpha1.ProxyConfig
	Username       string `json:"username,omitempty"`
	PasswordDigest string `json:"passwordDigest,omitempty"`
	WireGuard      string `json:"wireGuard,omitempty"`
}

// IntentHash is the hash of what the user asked for: provider, placement and
// spec.cloudInit, and for a Managed Proxy with spec.proxy also its port and the whole of
// spec.proxy, with the user name and a slow salted digest of the password
// (proxyconfig.CredentialsDigest) of creds in place of the basic-auth Secret's name. A
// Proxy without spec.proxy hands spec.cloudInit to its provider byte for byte, so its
// intent hash is its rendered hash, the one it always had.
// It also covers wg, the WireGuard configuration spec.proxy.egress.wireguard names (its
// digest, keys never in the clear), so that an edited WireGuard Secret rebuilds the
// instance; without one (nil) it covers none.
func IntentHash(px *v1alpha1.Proxy, creds *proxyconfig.Credentials, wg *proxyconfig.WireGuard) (string, error) {
	if px.Spec.Proxy == nil || px.Spec.Mode == v1alpha1.ProxyModeExternal {
		return RenderedHash(px, px.Spec.CloudInit), nil
	}
	in := intentInput{Provider: px.Spec.Provider, Placement: px.Spec.Placement, CloudInit: px.Spec.CloudInit,
		Port: px.Spec.Port, ProxyConfig: intentProxy(px.Spec.Proxy)}
	if err := in.secretDigests(creds, wg); err != nil {
		return "", err
	}
	return shortHash(in), nil
}

// secretDigests puts what the Secrets hold into in: the user name and the password's
// digest of creds, the digest of wg.
func (in *intentInput) secretDigests(creds *proxyconfig.Credentials, wg *proxyconfig.WireGuard) error {
	if creds != nil {
		d, err := proxyconfig.CredentialsDigest(*creds)
		if err != nil {
			return err
		}
		in.Username, in.PasswordDigest = creds.Username, d
	}
	if wg != nil {
		in.WireGuard = wg.Digest()
	}
	return nil
}

// intentProxy is spec.proxy as the intent hash covers it: all of it but the names of
// the Secrets it reads, whose contents the hash covers instead (a Secret renamed with the
// same contents rebuilds nothing; one edited in place rebuilds the instance). A struct
// left empty by that is left out, as when unset.
func intentProxy(p *v1alpha1.ProxyConfig) v1alpha1.ProxyConfig {
	c := *p.DeepCopy()
	if c.BasicAuth != nil {
		c.BasicAuth.SecretRef = v1alpha1.BasicAuthSecretRef{}
		if reflect.ValueOf(*c.BasicAuth).IsZero() {
			c.BasicAuth = nil
		}
	}
	if c.Egress != nil && c.Egress.WireGuard != nil {
		c.Egress.WireGuard.SecretRef, c.Egress.WireGuard.AssignedSecretRef = nil, nil
		if reflect.ValueOf(*c.Egress.WireGuard).IsZero() {
			c.Egress.WireGuard = nil
		}
	}
	if c.Egress != nil && reflect.ValueOf(*c.Egress).IsZero() {
		c.Egress = nil
	}
	return c
}

// partialIntentHash is the intent hash as operator versions before intentInput computed
// it, over part of spec.proxy only: port, source ranges, credentials and WireGuard, not
// allowedDestinations nor allowOpenProxy. It differs from IntentHash's only for a
// Proxy that sets one of those two, and tells a status.specHash such a version recorded
// from a spec edit made since (partialIntentRecorded).
func partialIntentHash(px *v1alpha1.Proxy, creds *proxyconfig.Credentials, wg *proxyconfig.WireGuard) (string, error) {
	if px.Spec.Proxy == nil || px.Spec.Mode == v1alpha1.ProxyModeExternal {
		return RenderedHash(px, px.Spec.CloudInit), nil
	}
	in := intentInput{Provider: px.Spec.Provider, Placement: px.Spec.Placement, CloudInit: px.Spec.CloudInit,
		Port: px.Spec.Port, ProxyConfig: v1alpha1.ProxyConfig{AllowedSourceRanges: px.Spec.Proxy.AllowedSourceRanges}}
	if err := in.secretDigests(creds, wg); err != nil {
		return "", err
	}
	return shortHash(in), nil
}

// RenderedHash is the hash of what an instance is built from: provider, placement and
// the user-data's hash input (proxyconfig.ForProxy's HashInput: spec.cloudInit itself for
// a Proxy without spec.proxy; with spec.proxy the rendered configuration, the password as
// a salted digest). It is the spec hash providers mark instances with, and what
// status.specHash held before the intent hash existed.
func RenderedHash(px *v1alpha1.Proxy, userDataHashInput string) string {
	return shortHash(struct {
		Provider  string                  `json:"provider"`
		Placement v1alpha1.ProxyPlacement `json:"placement"`
		CloudInit string                  `json:"cloudInit"`
	}{px.Spec.Provider, px.Spec.Placement, userDataHashInput})
}

func shortHash(v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		panic(fmt.Sprintf("marshalling proxy spec for hashing: %v", err)) // strings, numbers, bools and lists of them cannot fail
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])[:16]
}

// controllingPool is the name of the ProxyPool controlling px, or "".
func controllingPool(px *v1alpha1.Proxy) string {
	ref, _ := v1alpha1.ControllingPool(px)
	return ref.Name
}

// replaceAnnotationChanged lets through the updates of a Proxy whose replace annotation
// changed: they carry no new generation.
var replaceAnnotationChanged = predicate.Funcs{
	UpdateFunc: func(e event.UpdateEvent) bool {
		return e.ObjectOld != nil && e.ObjectNew != nil &&
			e.ObjectOld.GetAnnotations()[v1alpha1.ReplaceAnnotation] != e.ObjectNew.GetAnnotations()[v1alpha1.ReplaceAnnotation]
	},
	CreateFunc:  func(event.CreateEvent) bool { return false },
	DeleteFunc:  func(event.DeleteEvent) bool { return false },
	GenericFunc: func(event.GenericEvent) bool { return false },
}

// readBuildFacts reads what judgeBuild needs beside the Proxy: the partial intent hash
// and the credentials snapshot's word, each only where the verdict can turn on it.
func (r *ProxyReconciler) readBuildFacts(ctx context.Context, s *scope, want hashes, state string, creds *proxyconfig.Credentials, wg *proxyconfig.WireGuard) (buildFacts, error) {
	st := &s.px.Status
	f := buildFacts{want: want, state: state}
	if st.RenderedHash == "" || st.SpecHash == want.intent {
		return f, nil
	}
	partial, err := partialIntentHash(s.px, creds, wg)
	if err != nil {
		return f, err
	}
	f.partialIntent = partial
	if partial != st.SpecHash && controllingPool(s.px) != "" {
		f.onlyCredentialsChanged = r.onlyCredentialsChanged(ctx, s, wg)
	}
	return f, nil
}

// carryOut does what v says to the status, the credentials snapshot and the Events, in
// that order; the instance's action (keep, replace, restart) is reconcileManaged's. A
// snapshot that cannot be made returns its error (errSnapshotTaken among them) before
// any Event is recorded, the adopted hashes left on the status.
func (r *ProxyReconciler) carryOut(ctx context.Context, s *scope, v buildVerdict, creds *proxyconfig.Credentials) error {
	st := &s.px.Status
	st.SpecHash, st.RenderedHash, st.ObservedReplace = v.record.specHash, v.record.renderedHash, v.record.observedReplace
	if v.syncSnapshot {
		if err := r.syncSnapshot(ctx, s, creds); err != nil {
			return err
		}
	}
	if c := v.condition; c != nil && configOutdatedNews(s.px, c.Status, c.Reason) {
		s.log.Info("proxy configuration outdated", "reason", c.Reason, "message", c.Message)
	}
	for _, e := range v.events {
		s.event(e.typ, e.reason, common.ActionReconcile, "%s", e.message)
	}
	if v.condition != nil {
		meta.SetStatusCondition(&st.Conditions, *v.condition)
	}
	return nil
}

// onlyCredentialsChanged reports an intent that differs from the instance's by the
// credentials alone: with the ones the snapshot keeps, the spec hashes as it was built.
func (r *ProxyReconciler) onlyCredentialsChanged(ctx context.Context, s *scope, wg *proxyconfig.WireGuard) bool {
	px := s.px
	if px.Status.CredentialsSecret == "" || px.Spec.Proxy == nil || px.Spec.Proxy.BasicAuth == nil {
		return false
	}
	built, err := proxyconfig.ReadSnapshot(ctx, r.Client, px)
	if err != nil {
		s.log.Info("credentials snapshot unreadable; treating the change as a spec change", "error", err.Error())
		return false
	}
	h, err := IntentHash(px, built, wg)
	if err == nil && h != px.Status.SpecHash {
		// Or as recorded by an operator version that covered part of spec.proxy.
		h, err = partialIntentHash(px, built, wg)
	}
	return err == nil && h == px.Status.SpecHash
}

// judge reads the facts, judges the instance (judgeBuild) and carries out the verdict
// but for its action, which it returns with the verdict.
func (r *ProxyReconciler) judge(ctx context.Context, s *scope, want hashes, state string, creds *proxyconfig.Credentials, wg *proxyconfig.WireGuard) (buildVerdict, error) {
	f, err := r.readBuildFacts(ctx, s, want, state, creds, wg)
	if err != nil {
		return buildVerdict{}, err
	}
	v := judgeBuild(s.px, f)
	return v, r.carryOut(ctx, s, v, creds)
}
