package api

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// apiError is every error the API answers: a stable code for programs, a message for people,
// and the field at fault when the request was invalid. Never a stack trace or a driver's
// message with internals: unexpected errors are logged and answered "internal".
type apiError struct {
	Status  int    `json:"-"`
	Code    string `json:"code"`
	Message string `json:"message"`
	Field   string `json:"field,omitempty"`
}

func (e *apiError) Error() string { return e.Message }

// errorBody is the JSON the API answers with an error.
type errorBody struct {
	Error *apiError `json:"error"`
}

func errNotFound(what, id string) *apiError {
	return &apiError{Status: http.StatusNotFound, Code: "not_found", Message: fmt.Sprintf("%s %s not found", what, id)}
}

func errInvalid(field, format string, args ...any) *apiError {
	return &apiError{Status: http.StatusUnprocessableEntity, Code: "invalid", Field: field, Message: fmt.Sprintf(format, args...)}
}

func errConflict(format string, args ...any) *apiError {
	return &apiError{Status: http.StatusConflict, Code: "conflict", Message: fmt.Sprintf(format, args...)}
}

func errBadRequest(format string, args ...any) *apiError {
	return &apiError{Status: http.StatusBadRequest, Code: "bad_request", Message: fmt.Sprintf(format, args...)}
}

var (
	errUnauthorized = &apiError{Status: http.StatusUnauthorized, Code: "unauthorized",
		Message: "a valid API key is required: send it as Authorization: Bearer fhk_... (fluxhook api-keys add makes one)"}
	errAdminOnly = &apiError{Status: http.StatusForbidden, Code: "forbidden",
		Message: "this route needs an admin key (fluxhook api-keys add --admin), not a tenant key or a portal session"}
	errInternal = &apiError{Status: http.StatusInternalServerError, Code: "internal",
		Message: "the server could not complete the request; it is logged with this request's id"}
)

// writeJSON answers v with status.
func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	// The API shares its origin with the portal, whose token is in that origin's storage: no
	// answer may be sniffed into a page, run anything or be framed.
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; frame-ancestors 'none'")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false)
	_ = enc.Encode(v)
}

// asAPIError is err as the API answers it, and whether it is an expected one (an apiError);
// anything else is internal.
func asAPIError(err error) (*apiError, bool) {
	var ae *apiError
	if errors.As(err, &ae) {
		return ae, true
	}
	return errInternal, false
}
