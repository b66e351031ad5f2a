package client

// Version is this package's version: the project's release (its VERSION file), whose
// tag v<Version> is what `go get .../pkg/client@v<Version>` fetches. A crawler may log it
// or put it in its own User-Agent; the client sends it nowhere.
const Version = "0.1.0"
