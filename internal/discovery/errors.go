package discovery

import (
	"encoding/json"
	"net/http"
	"strconv"
)

// apiError is the body of every error answer: {"error": "...", "parameter": "..."}.
type apiError struct {
	status    int
	Message   string `json:"error"`
	Parameter string `json:"parameter,omitempty"`
	// retryAfter, when more than 0, is sent as Retry-After (seconds).
	retryAfter int
	// site is the site a saturation refusal is about.
	site string
	// challenge, when set, is sent as WWW-Authenticate.
	challenge string
}

func badParam(param, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, Message: msg, Parameter: param}
}

func writeError(w http.ResponseWriter, e *apiError) {
	b, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	if e.challenge != "" {
		w.Header().Set("WWW-Authenticate", e.challenge)
	}
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(e.retryAfter))
	}
	w.WriteHeader(e.status)
	_, _ = w.Write(append(b, '\n'))
}
