package discovery

import (
	"encoding/json"
	"net/http"
)

// apiError is the body of every error answer: {"error": "...", "parameter": "..."}.
type apiError struct {
	status    int
	Message   string `json:"error"`
	Parameter string `json:"parameter,omitempty"`
}

func badParam(param, msg string) *apiError {
	return &apiError{status: http.StatusBadRequest, Message: msg, Parameter: param}
}

func writeError(w http.ResponseWriter, e *apiError) {
	b, _ := json.Marshal(e)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(e.status)
	_, _ = w.Write(append(b, '\n'))
}
