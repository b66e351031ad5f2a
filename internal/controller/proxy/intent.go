package proxy

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"reflect"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// replaceRequested is the value of a replace annotation not acted on yet, or "".
func replaceRequested(px *v1alpha1.Proxy) string {
	v := px.Annotations[v1alpha1.ReplaceAnnotation]
	if v == "" || v == px.Status.ObservedReplace {
		return ""
	}
	return v
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

// judgeBuild compares the running instance with what the operator would build now and
// returns why it must be replaced, or "" to keep it. On the way it adopts an instance
// built by an operator version that recorded no intent hash, or an intent hash over part
// of spec.proxy (adoptPartialIntent), and sets ConfigOutdated:
//   - a new intent (spec edited, password rotated) replaces the instance, except a pool
//     child's whose spec is unchanged: its pool replaces it surge-first
//     (ConfigOutdated=True, CredentialsChanged) while it keeps serving with its snapshot;
//   - a new rendering alone (an operator upgrade) keeps it (ConfigOutdated=True,
//     RenderingChanged) until a standalone Proxy's replace annotation gets a new value
//     or, for a pool child, its pool replaces it;
//   - a new replace annotation value rebuilds a standalone Proxy's instance in any case.
func (r *ProxyReconciler) judgeBuild(ctx context.Context, s *scope, want hashes, creds *proxyconfig.Credentials, wg *proxyconfig.WireGuard) (string, error) {
	px := s.px
	st := &px.Status
	pool := controllingPool(px)
	if st.RenderedHash == "" {
		// Built before the intent hash was recorded: status.specHash holds what is now the
		// rendered hash, of that version's rendering. It is adopted whether it matches this
		// version's rendering or not: a mismatch cannot be told from a rendering this
		// version changed, and replacing on a guess would replace every such instance at
		// once. A mismatch shows ConfigOutdated (RenderingChanged) below, and rolls like
		// any rendering change: a pool surge-first, a standalone Proxy on the annotation.
		built := st.SpecHash
		st.SpecHash, st.RenderedHash, st.ObservedReplace = want.intent, built, px.Annotations[v1alpha1.ReplaceAnnotation]
		if err := r.syncSnapshot(ctx, s, creds); err != nil {
			return "", err
		}
		if built == want.rendered {
			s.event(corev1.EventTypeNormal, v1alpha1.ReasonAdopted, common.ActionReconcile,
				"instance %s, built by an earlier operator version, is kept as it is: it matches the spec (spec hash %s, rendered hash %s)",
				px.InstanceName(), want.intent, want.rendered)
		} else {
			s.event(corev1.EventTypeNormal, v1alpha1.ReasonAdopted, common.ActionReconcile,
				"instance %s, built by an earlier operator version from another rendering (hash %s; this version's is %s), is kept as it is and shown ConfigOutdated",
				px.InstanceName(), built, want.rendered)
		}
	}
	if why, err := adoptPartialIntent(s, want, creds, wg); why != "" || err != nil {
		return why, err
	}
	if st.SpecHash != want.intent {
		if pool != "" && r.onlyCredentialsChanged(ctx, s, wg) {
			s.setConfigOutdated(metav1.ConditionTrue, v1alpha1.ReasonCredentialsChanged, fmt.Sprintf(
				"the credentials Secret %s changed; instance %s keeps serving with the credentials it was built with (Secret %s) until ProxyPool %s replaces it",
				px.Spec.Proxy.BasicAuth.SecretRef.Name, px.InstanceName(), st.CredentialsSecret, pool))
			return "", nil
		}
		return "spec changed", nil
	}
	if v := replaceRequested(px); v != "" {
		if pool == "" {
			return fmt.Sprintf("replacement asked for by annotation %s=%q", v1alpha1.ReplaceAnnotation, v), nil
		}
		st.ObservedReplace = v
		s.event(corev1.EventTypeWarning, v1alpha1.ReasonReplaceIgnored, common.ActionReconcile,
			"annotation %s=%q is ignored on a child of ProxyPool %s: the pool replaces its children (surge-first) when their ConfigOutdated condition is True or its template changes",
			v1alpha1.ReplaceAnnotation, v, pool)
	}
	if st.RenderedHash != want.rendered {
		// Another version's rendering, after an upgrade; or, for a Proxy adopted from a
		// version whose intent missed part of spec.proxy, possibly an edit of that part.
		msg := fmt.Sprintf("instance %s was built from another rendering (rendered hash %s) than this operator version makes of the spec (%s): "+
			"another operator version built it, or an earlier one kept it when spec.proxy.allowedDestinations or allowOpenProxy was edited; it keeps running as it is; ",
			px.InstanceName(), st.RenderedHash, want.rendered)
		if pool != "" {
			msg += fmt.Sprintf("ProxyPool %s replaces it surge-first", pool)
		} else {
			msg += fmt.Sprintf("to build it again: kubectl annotate proxy -n %s %s %s=\"$(date +%%s)\" --overwrite", px.Namespace, px.Name, v1alpha1.ReplaceAnnotation)
		}
		s.setConfigOutdated(metav1.ConditionTrue, v1alpha1.ReasonRenderingChanged, msg)
		return "", nil
	}
	// The intent matches, so the referenced Secret holds what the instance was built
	// with: a snapshot lost since is made again from it.
	if err := r.syncSnapshot(ctx, s, creds); err != nil {
		return "", err
	}
	s.setConfigUpToDate()
	return "", nil
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

// adoptPartialIntent takes over an instance whose status.specHash an operator version
// that covered only part of spec.proxy recorded (partialIntentHash) and that still
// matches the spec: the hash is new, not the user's intent. A pool child is kept (a
// rendering that differs shows ConfigOutdated below, and its pool replaces it
// surge-first), and so is a standalone Proxy built from this version's rendering. A
// standalone Proxy built from another rendering is replaced: allowedDestinations or
// allowOpenProxy may have been edited under that version, which kept the instance, and
// that cannot be told from an operator upgrade; keeping it could keep a fence the user
// narrowed open. It returns why the instance must be replaced, or "".
func adoptPartialIntent(s *scope, want hashes, creds *proxyconfig.Credentials, wg *proxyconfig.WireGuard) (string, error) {
	px := s.px
	st := &px.Status
	if st.SpecHash == want.intent {
		return "", nil
	}
	partial, err := partialIntentHash(px, creds, wg)
	if err != nil || partial != st.SpecHash {
		return "", err
	}
	if st.RenderedHash != want.rendered && controllingPool(px) == "" {
		return "spec.proxy.allowedDestinations or allowOpenProxy may have been edited under an earlier operator version, which kept the instance built before the edit", nil
	}
	st.SpecHash = want.intent
	s.event(corev1.EventTypeNormal, v1alpha1.ReasonAdopted, common.ActionReconcile,
		"instance %s is kept: its spec hash %s, recorded by an earlier operator version over part of spec.proxy, matches the spec; this version's, over all of it, is %s",
		px.InstanceName(), partial, want.intent)
	return "", nil
}

// setConfigOutdated sets the ConfigOutdated condition, with a Normal Event when it turns
// True or changes reason.
func (s *scope) setConfigOutdated(status metav1.ConditionStatus, reason, message string) {
	old := meta.FindStatusCondition(s.px.Status.Conditions, v1alpha1.ConditionConfigOutdated)
	if status == metav1.ConditionTrue && (old == nil || old.Status != status || old.Reason != reason) {
		s.log.Info("proxy configuration outdated", "reason", reason, "message", message)
		s.event(corev1.EventTypeNormal, reason, common.ActionReconcile, "ConfigOutdated: %s", message)
	}
	meta.SetStatusCondition(&s.px.Status.Conditions, metav1.Condition{
		Type:               v1alpha1.ConditionConfigOutdated,
		Status:             status,
		Reason:             reason,
		Message:            message,
		ObservedGeneration: s.px.Generation,
	})
}

// setConfigUpToDate sets ConfigOutdated=False: the instance is what this operator
// version builds for the spec.
func (s *scope) setConfigUpToDate() {
	s.setConfigOutdated(metav1.ConditionFalse, v1alpha1.ReasonUpToDate,
		fmt.Sprintf("instance %s runs the configuration this operator version builds for the spec", s.px.InstanceName()))
}
