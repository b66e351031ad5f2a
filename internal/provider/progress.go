package provider

import "context"

// Progress is a long step a provider reports while a call is still running, so the
// caller can show it (the reconciler puts it on the Proxy's status).
type Progress struct {
	// Reason is a condition reason, for example ImageDownloading.
	Reason string
	// Message is a sentence a user reads.
	Message string
	// Done and Total count bytes or steps; Total is 0 when unknown.
	Done, Total int64
}

// Reasons a provider reports progress with.
const ReasonImageDownloading = "ImageDownloading"

type progressKey struct{}

// WithProgress returns a context whose provider calls report progress to fn. fn must be
// cheap and safe for concurrent use; providers rate-limit their reports themselves.
func WithProgress(ctx context.Context, fn func(Progress)) context.Context {
	return context.WithValue(ctx, progressKey{}, fn)
}

// ReportProgress hands p to the function installed by WithProgress, if any.
func ReportProgress(ctx context.Context, p Progress) {
	if fn, ok := ctx.Value(progressKey{}).(func(Progress)); ok && fn != nil {
		fn(p)
	}
}
