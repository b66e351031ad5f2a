// Package manifest decodes the YAML manifests users apply (config/samples): Proxies,
// ProxyPools and the Secrets they name, one per document, strictly, so a misspelt field is
// an error.
package manifest

import (
	"errors"
	"fmt"
	"regexp"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	v1alpha1 "gitea.home.hrajfrisbee.cz/kacerr/egress-proxies-operator/api/v1alpha1"
)

var separator = regexp.MustCompile(`(?m)^---\s*$`)

// Decode returns the objects of data's documents in order: *v1alpha1.Proxy,
// *v1alpha1.ProxyPool and *corev1.Secret. Documents of comments only are skipped; any other kind is an error.
func Decode(data []byte) ([]client.Object, error) {
	var objs []client.Object
	for i, doc := range separator.Split(string(data), -1) {
		var tm metav1.TypeMeta
		if err := yaml.Unmarshal([]byte(doc), &tm); err != nil {
			return nil, fmt.Errorf("document %d: %w", i+1, err)
		}
		var obj client.Object
		switch tm.Kind {
		case "":
			continue
		case "Proxy":
			obj = &v1alpha1.Proxy{}
		case "ProxyPool":
			obj = &v1alpha1.ProxyPool{}
		case "Secret":
			obj = &corev1.Secret{}
		default:
			return nil, fmt.Errorf("document %d: kind %q; want a Proxy, a ProxyPool or a Secret", i+1, tm.Kind)
		}
		if err := yaml.UnmarshalStrict([]byte(doc), obj); err != nil {
			return nil, fmt.Errorf("document %d (%s): %w", i+1, tm.Kind, err)
		}
		objs = append(objs, obj)
	}
	if len(objs) == 0 {
		return nil, errors.New("no Proxy, ProxyPool or Secret in it")
	}
	return objs, nil
}
