package common

// The discovery API authenticates Kubernetes callers (TokenReview) and authorizes them
// per namespace (SubjectAccessReview) on every replica (internal/access).
// +kubebuilder:rbac:groups=authentication.k8s.io,resources=tokenreviews,verbs=create
// +kubebuilder:rbac:groups=authorization.k8s.io,resources=subjectaccessreviews,verbs=create
