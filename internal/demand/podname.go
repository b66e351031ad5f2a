package demand

import (
	"fmt"
	"os"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// PodName names this replica as a measurer: the POD_NAME environment variable (a
// Deployment sets it from the pod's name), else the host name (a pod's is its name), else
// fallback.
func PodName(fallback string) string {
	if n := os.Getenv("POD_NAME"); n != "" {
		return n
	}
	if h, err := os.Hostname(); err == nil && h != "" {
		return h
	}
	return fallback
}

// ServiceAccountNamespaceFile is where a pod finds its own namespace.
const ServiceAccountNamespaceFile = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"

// DefaultNamespace is the default demand namespace: the pod's own namespace, from the
// POD_NAMESPACE environment variable (a Deployment sets it from the pod's namespace),
// else from the service account's namespace file (ServiceAccountNamespaceFile), else
// "default". from says which one it was, for the start log.
func DefaultNamespace() (ns, from string) {
	return defaultNamespace(ServiceAccountNamespaceFile)
}

func defaultNamespace(file string) (ns, from string) {
	if n := strings.TrimSpace(os.Getenv("POD_NAMESPACE")); n != "" {
		return n, "POD_NAMESPACE"
	}
	if b, err := os.ReadFile(file); err == nil {
		if n := strings.TrimSpace(string(b)); n != "" {
			return n, file
		}
	}
	return "default", "default"
}

// FlagNamespace is the demand namespace of a binary's --demand-namespace flag value: the
// value itself (which must be a namespace name), or DefaultNamespace when it is empty.
// from says where it came from, for the start log.
func FlagNamespace(value string) (ns, from string, err error) {
	if value == "" {
		ns, from = DefaultNamespace()
		return ns, from, nil
	}
	if errs := validation.IsDNS1123Label(value); len(errs) > 0 {
		return "", "", fmt.Errorf("--demand-namespace %q: not a namespace name: %s", value, strings.Join(errs, "; "))
	}
	return value, "--demand-namespace", nil
}
