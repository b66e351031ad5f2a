package access

import (
	"context"
	"fmt"

	authnv1 "k8s.io/api/authentication/v1"
	authzv1 "k8s.io/api/authorization/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Reviewer asks the API server about a token or an access: the two calls this package
// makes, and the seam its tests fake.
type Reviewer interface {
	// ReviewToken creates a TokenReview of token. An error means the review could not
	// be made (no answer); a token the API server does not know is a status with
	// Authenticated false, not an error.
	ReviewToken(ctx context.Context, token string) (*authnv1.TokenReviewStatus, error)
	// ReviewAccess creates a SubjectAccessReview of spec. An error means no answer; a
	// denial is a status with Allowed false.
	ReviewAccess(ctx context.Context, spec authzv1.SubjectAccessReviewSpec) (*authzv1.SubjectAccessReviewStatus, error)
}

// ClientReviewer makes the reviews through a controller-runtime client (create on
// tokenreviews and subjectaccessreviews).
type ClientReviewer struct{ Client client.Client }

var _ Reviewer = ClientReviewer{}

func (r ClientReviewer) ReviewToken(ctx context.Context, token string) (*authnv1.TokenReviewStatus, error) {
	tr := &authnv1.TokenReview{Spec: authnv1.TokenReviewSpec{Token: token}}
	if err := r.Client.Create(ctx, tr); err != nil {
		return nil, fmt.Errorf("creating a TokenReview: %w", err)
	}
	return &tr.Status, nil
}

func (r ClientReviewer) ReviewAccess(ctx context.Context, spec authzv1.SubjectAccessReviewSpec) (*authzv1.SubjectAccessReviewStatus, error) {
	sar := &authzv1.SubjectAccessReview{Spec: spec}
	if err := r.Client.Create(ctx, sar); err != nil {
		return nil, fmt.Errorf("creating a SubjectAccessReview: %w", err)
	}
	return &sar.Status, nil
}
