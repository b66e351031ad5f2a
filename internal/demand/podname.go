package demand

import "os"

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
