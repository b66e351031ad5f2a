package v1alpha1

import (
	"os"
	"path/filepath"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/yaml"
)

func TestPort(t *testing.T) {
	for _, tc := range []struct {
		name string
		port int32
		want int32
	}{
		{"not set: the default", 0, 3128},
		{"set to the default", 3128, 3128},
		{"set", 8080, 8080},
		{"lowest", 1, 1},
	} {
		px := &Proxy{Spec: ProxySpec{Port: tc.port}}
		if got := px.Port(); got != tc.want {
			t.Errorf("%s: Port() = %d, want %d", tc.name, got, tc.want)
		}
		if got := px.Spec.PortOrDefault(); got != tc.want {
			t.Errorf("%s: PortOrDefault() = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// The CRDs default spec.port (a Proxy's and a pool template's) to DefaultPort: the
// +kubebuilder:default marker cannot name the constant, so this ties the two.
func TestCRDPortDefaultIsDefaultPort(t *testing.T) {
	for _, tc := range []struct {
		file string
		path []string // from the version's openAPIV3Schema
	}{
		{"egress.hrajfrisbee.cz_proxies.yaml", []string{"properties", "spec", "properties", "port", "default"}},
		{"egress.hrajfrisbee.cz_proxypools.yaml", []string{"properties", "spec", "properties", "template", "properties", "spec", "properties", "port", "default"}},
	} {
		b, err := os.ReadFile(filepath.Join("..", "..", "config", "crd", "bases", tc.file))
		if err != nil {
			t.Fatal(err)
		}
		var crd struct {
			Spec struct {
				Versions []struct {
					Name   string `json:"name"`
					Schema struct {
						OpenAPIV3Schema map[string]any `json:"openAPIV3Schema"`
					} `json:"schema"`
				} `json:"versions"`
			} `json:"spec"`
		}
		if err := yaml.Unmarshal(b, &crd); err != nil {
			t.Fatalf("%s: %v", tc.file, err)
		}
		if len(crd.Spec.Versions) == 0 {
			t.Fatalf("%s: no versions", tc.file)
		}
		for _, v := range crd.Spec.Versions {
			var node any = v.Schema.OpenAPIV3Schema
			for _, key := range tc.path {
				m, _ := node.(map[string]any)
				node = m[key]
			}
			if got, ok := node.(float64); !ok || int32(got) != DefaultPort {
				t.Errorf("%s, version %s: spec.port defaults to %v, want DefaultPort %d", tc.file, v.Name, node, DefaultPort)
			}
		}
	}
}

func TestServing(t *testing.T) {
	now := metav1.Now()
	serving := func() *Proxy {
		return &Proxy{ObjectMeta: metav1.ObjectMeta{Name: "p", Annotations: map[string]string{"other": "x"}},
			Status: ProxyStatus{Phase: PhaseReady, Healthy: true}}
	}
	for _, tc := range []struct {
		name   string
		change func(*Proxy)
		want   bool
	}{
		{"healthy and Ready", func(*Proxy) {}, true},
		{"no annotations at all", func(p *Proxy) { p.Annotations = nil }, true},
		{"not healthy", func(p *Proxy) { p.Status.Healthy = false }, false},
		{"Running, not Ready yet", func(p *Proxy) { p.Status.Phase = PhaseRunning }, false},
		{"Failed", func(p *Proxy) { p.Status.Phase = PhaseFailed }, false},
		{"Deleting", func(p *Proxy) { p.Status.Phase = PhaseDeleting }, false},
		{"being deleted while still Ready", func(p *Proxy) { p.DeletionTimestamp = &now }, false},
		{"cordoned", func(p *Proxy) { p.Annotations[CordonAnnotation] = "true" }, false},
		{"cordon annotation not true", func(p *Proxy) { p.Annotations[CordonAnnotation] = "false" }, true},
		{"cordon annotation empty", func(p *Proxy) { p.Annotations[CordonAnnotation] = "" }, true},
	} {
		px := serving()
		tc.change(px)
		if got := px.Serving(); got != tc.want {
			t.Errorf("%s: Serving() = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestControllingPoolAndProxy(t *testing.T) {
	ref := func(apiVersion, kind string, controller bool) metav1.OwnerReference {
		return metav1.OwnerReference{APIVersion: apiVersion, Kind: kind, Name: "owner", UID: "u-1", Controller: ptr.To(controller)}
	}
	gv := GroupVersion.String()
	for _, tc := range []struct {
		name      string
		refs      []metav1.OwnerReference
		pool, prx bool
	}{
		{"no owner", nil, false, false},
		{"a ProxyPool of this group", []metav1.OwnerReference{ref(gv, "ProxyPool", true)}, true, false},
		{"a ProxyPool of a later version of this group", []metav1.OwnerReference{ref(GroupVersion.Group+"/v1beta1", "ProxyPool", true)}, true, false},
		{"a ProxyPool of another group", []metav1.OwnerReference{ref("example.com/v1alpha1", "ProxyPool", true)}, false, false},
		{"a group whose name starts like ours", []metav1.OwnerReference{ref(GroupVersion.Group+".example.com/v1alpha1", "ProxyPool", true)}, false, false},
		{"a ProxyPool of the core group", []metav1.OwnerReference{ref("v1", "ProxyPool", true)}, false, false},
		{"a ProxyPool owner that is not the controller", []metav1.OwnerReference{ref(gv, "ProxyPool", false)}, false, false},
		{"the controller is another kind", []metav1.OwnerReference{ref(gv, "ProxyPool", false), ref("apps/v1", "ReplicaSet", true)}, false, false},
		{"a Proxy of this group", []metav1.OwnerReference{ref(gv, "Proxy", true)}, false, true},
		{"a Proxy of another group", []metav1.OwnerReference{ref("example.com/v1", "Proxy", true)}, false, false},
	} {
		obj := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "s", OwnerReferences: tc.refs}}
		got, ok := ControllingPool(obj)
		if ok != tc.pool || (ok && (got.Name != "owner" || got.UID != "u-1")) {
			t.Errorf("%s: ControllingPool = %+v, %v; want ok %v", tc.name, got, ok, tc.pool)
		}
		got, ok = ControllingProxy(obj)
		if ok != tc.prx || (ok && (got.Name != "owner" || got.UID != "u-1")) {
			t.Errorf("%s: ControllingProxy = %+v, %v; want ok %v", tc.name, got, ok, tc.prx)
		}
	}
}
