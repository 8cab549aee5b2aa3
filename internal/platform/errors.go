package platform

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"unicode/utf8"
)

// gRPC-style codes the platform puts in error bodies (AIP-193).
const (
	CodeInvalidArgument    = 3
	CodeNotFound           = 5
	CodeAlreadyExists      = 6
	CodePermissionDenied   = 7
	CodeResourceExhausted  = 8
	CodeFailedPrecondition = 9
	CodeUnavailable        = 14
	CodeUnauthenticated    = 16
)

// Error is an error answer from the platform or the registry: the HTTP
// status with whatever the AIP-193 body said about it.
type Error struct {
	Method, URL string // the request, without its query's secrets (none are sent in queries)
	Status      int
	Code        int    // gRPC-style code from the body; 0 when the body had none
	Message     string // from the body
	Reason      string // ErrorInfo.reason
	Domain      string // ErrorInfo.domain
	// FieldViolations from BadRequest details.
	FieldViolations []FieldViolation
	// PreconditionViolations from PreconditionFailure details.
	PreconditionViolations []PreconditionViolation
	// ResourceInfo holds the members of a ResourceInfo detail as sent.
	ResourceInfo map[string]string
	// Excerpt is the start of a body that was not an AIP-193 error.
	Excerpt string

	// challenge is a 401's WWW-Authenticate header, for the registry's
	// token dance.
	challenge string
}

// FieldViolation is one entry of a BadRequest detail.
type FieldViolation struct {
	Field       string `json:"field"`
	Description string `json:"description"`
}

// PreconditionViolation is one entry of a PreconditionFailure detail.
type PreconditionViolation struct {
	Type        string `json:"type"`
	Subject     string `json:"subject,omitempty"`
	Description string `json:"description"`
}

func (e *Error) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s: %d %s", e.Method, e.URL, e.Status, http.StatusText(e.Status))
	if e.Message != "" {
		fmt.Fprintf(&b, ": %s", e.Message)
	}
	for _, v := range e.FieldViolations {
		fmt.Fprintf(&b, "; field %s: %s", v.Field, v.Description)
	}
	for _, v := range e.PreconditionViolations {
		fmt.Fprintf(&b, "; precondition %s: %s", v.Type, v.Description)
	}
	if e.Message == "" && e.Excerpt != "" {
		fmt.Fprintf(&b, ": %q", e.Excerpt)
	}
	return b.String()
}

// decodeError turns an error response into an *Error. A body that is not an
// AIP-193 error still yields the status and a short excerpt.
func decodeError(method, url string, status int, body []byte) *Error {
	e := &Error{Method: method, URL: url, Status: status}
	var raw struct {
		Code    int               `json:"code"`
		Message string            `json:"message"`
		Details []json.RawMessage `json:"details"`
		// Some gateways wrap the status in "error".
		Error *struct {
			Code    int               `json:"code"`
			Message string            `json:"message"`
			Details []json.RawMessage `json:"details"`
		} `json:"error"`
		// The registry answers in the OCI distribution format instead.
		Errors []struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"errors"`
	}
	if err := json.Unmarshal(body, &raw); err != nil {
		e.Excerpt = excerpt(body, 200)
		return e
	}
	if raw.Error != nil {
		raw.Code, raw.Message, raw.Details = raw.Error.Code, raw.Error.Message, raw.Error.Details
	}
	if raw.Code == 0 && raw.Message == "" && len(raw.Errors) > 0 {
		// OCI: the first error's code is the machine-readable reason.
		e.Reason = raw.Errors[0].Code
		msgs := make([]string, 0, len(raw.Errors))
		for _, oe := range raw.Errors {
			if m := strings.TrimSpace(oe.Code + " " + oe.Message); m != "" {
				msgs = append(msgs, m)
			}
		}
		e.Message = strings.Join(msgs, "; ")
		return e
	}
	if raw.Code == 0 && raw.Message == "" {
		e.Excerpt = excerpt(body, 200)
		return e
	}
	e.Code, e.Message = raw.Code, raw.Message
	for _, d := range raw.Details {
		var head struct {
			Type string `json:"@type"`
		}
		if json.Unmarshal(d, &head) != nil {
			continue
		}
		switch kind := head.Type[strings.LastIndexAny(head.Type, "/.")+1:]; kind {
		case "ErrorInfo":
			var v struct{ Reason, Domain string }
			if json.Unmarshal(d, &v) == nil {
				e.Reason, e.Domain = v.Reason, v.Domain
			}
		case "BadRequest":
			var v struct {
				FieldViolations []FieldViolation `json:"fieldViolations"`
			}
			if json.Unmarshal(d, &v) == nil {
				e.FieldViolations = append(e.FieldViolations, v.FieldViolations...)
			}
		case "PreconditionFailure":
			var v struct {
				Violations []PreconditionViolation `json:"violations"`
			}
			if json.Unmarshal(d, &v) == nil {
				e.PreconditionViolations = append(e.PreconditionViolations, v.Violations...)
			}
		case "ResourceInfo":
			var v map[string]any
			if json.Unmarshal(d, &v) == nil {
				e.ResourceInfo = make(map[string]string)
				for k, x := range v {
					if s, ok := x.(string); ok && k != "@type" {
						e.ResourceInfo[k] = s
					}
				}
			}
		}
	}
	return e
}

func excerpt(b []byte, n int) string {
	if len(b) > n {
		b = b[:n]
		for len(b) > 0 && !utf8.Valid(b) {
			b = b[:len(b)-1]
		}
	}
	return strings.TrimSpace(string(b))
}

// is reports whether err is an *Error with the given gRPC code or, when the
// body carried no code, the given HTTP status. The code decides when there
// is one, because statuses are shared: grpc-gateway answers both
// INVALID_ARGUMENT and FAILED_PRECONDITION with 400.
func is(err error, status, code int) bool {
	var e *Error
	if !errors.As(err, &e) {
		return false
	}
	if e.Code != 0 {
		return e.Code == code
	}
	return e.Status == status
}

// AsError returns the *Error in err's chain, if there is one.
func AsError(err error) (*Error, bool) {
	var e *Error
	ok := errors.As(err, &e)
	return e, ok
}

// IsNotFound reports whether err says the resource does not exist.
func IsNotFound(err error) bool { return is(err, http.StatusNotFound, CodeNotFound) }

// IsInvalidArgument reports whether err rejects the request's arguments.
func IsInvalidArgument(err error) bool {
	return is(err, http.StatusBadRequest, CodeInvalidArgument)
}

// IsAlreadyExists reports whether err says the resource exists already.
func IsAlreadyExists(err error) bool { return is(err, http.StatusConflict, CodeAlreadyExists) }

// IsFailedPrecondition reports whether err says the system is not in a state
// the request needs (for example deleting a group that has children).
func IsFailedPrecondition(err error) bool {
	var e *Error
	return errors.As(err, &e) && (e.Code == CodeFailedPrecondition || e.Reason == "FAILED_PRECONDITION")
}

// IsPermission reports whether err is an authentication or authorization
// failure (401 or 403).
func IsPermission(err error) bool {
	return is(err, http.StatusForbidden, CodePermissionDenied) || is(err, http.StatusUnauthorized, CodeUnauthenticated)
}

// IsRateLimited reports whether err is a 429 the retries did not outlast.
func IsRateLimited(err error) bool {
	return is(err, http.StatusTooManyRequests, CodeResourceExhausted)
}
