package platformsim

import (
	"encoding/json"
	"fmt"
	"net/http"
)

// gRPC status codes used by the platform's AIP-193 error bodies.
const (
	codeInvalidArgument    = 3
	codeNotFound           = 5
	codeAlreadyExists      = 6
	codePermissionDenied   = 7
	codeResourceExhausted  = 8
	codeFailedPrecondition = 9
	codeInternal           = 13
	codeUnavailable        = 14
	codeUnauthenticated    = 16
)

const typeURLPrefix = "type.googleapis.com/google.rpc."

// apiError is an AIP-193 error body together with the HTTP status it maps to.
type apiError struct {
	status  int
	Code    int              `json:"code"`
	Message string           `json:"message"`
	Details []map[string]any `json:"details"`
}

// httpStatusOf maps gRPC codes the way grpc-gateway does, which is what a
// gateway-fronted gRPC service such as the platform answers over HTTP.
func httpStatusOf(code int) int {
	switch code {
	case codeInvalidArgument, codeFailedPrecondition:
		return http.StatusBadRequest
	case codeNotFound:
		return http.StatusNotFound
	case codeAlreadyExists:
		return http.StatusConflict
	case codePermissionDenied:
		return http.StatusForbidden
	case codeResourceExhausted:
		return http.StatusTooManyRequests
	case codeUnavailable:
		return http.StatusServiceUnavailable
	case codeUnauthenticated:
		return http.StatusUnauthorized
	default:
		return http.StatusInternalServerError
	}
}

// reasonOf names a code the way ErrorInfo.reason spells it.
func reasonOf(code int) string {
	switch code {
	case codeInvalidArgument:
		return "INVALID_ARGUMENT"
	case codeNotFound:
		return "NOT_FOUND"
	case codeAlreadyExists:
		return "ALREADY_EXISTS"
	case codePermissionDenied:
		return "PERMISSION_DENIED"
	case codeResourceExhausted:
		return "RESOURCE_EXHAUSTED"
	case codeFailedPrecondition:
		return "FAILED_PRECONDITION"
	case codeUnavailable:
		return "UNAVAILABLE"
	case codeUnauthenticated:
		return "UNAUTHENTICATED"
	default:
		return "INTERNAL"
	}
}

func (s *Sim) newError(code int, message string, extra ...map[string]any) *apiError {
	e := &apiError{status: httpStatusOf(code), Code: code, Message: message}
	e.Details = append(e.Details, map[string]any{
		"@type":  typeURLPrefix + "ErrorInfo",
		"reason": reasonOf(code),
		"domain": s.opts.ErrorDomain,
	})
	e.Details = append(e.Details, extra...)
	return e
}

// errInvalid reports one invalid field with a BadRequest detail.
func (s *Sim) errInvalid(field, description string) *apiError {
	return s.newError(codeInvalidArgument,
		fmt.Sprintf("Invalid argument: %s: %s", field, description),
		map[string]any{
			"@type": typeURLPrefix + "BadRequest",
			"fieldViolations": []map[string]string{
				{"field": field, "description": description},
			},
		})
}

func (s *Sim) errNotFound(resourceType, name string) *apiError {
	return s.newError(codeNotFound,
		fmt.Sprintf("Not found: %s %q", resourceType, name),
		map[string]any{
			"@type":        typeURLPrefix + "ResourceInfo",
			"resourceType": resourceType,
			"resourceName": name,
			"description":  "the resource does not exist",
		})
}

func (s *Sim) errNotEmpty(resourceType, name string, children int) *apiError {
	desc := fmt.Sprintf("%s %q still has %d child resources", resourceType, name, children)
	return s.newError(codeFailedPrecondition, "Precondition failed: "+desc,
		map[string]any{
			"@type": typeURLPrefix + "PreconditionFailure",
			"violations": []map[string]string{
				{"type": "RESOURCE_NOT_EMPTY", "subject": name, "description": desc},
			},
		})
}

func (s *Sim) errAlreadyExists(resourceType, name string) *apiError {
	return s.newError(codeAlreadyExists,
		fmt.Sprintf("Already exists: %s %q", resourceType, name),
		map[string]any{
			"@type":        typeURLPrefix + "ResourceInfo",
			"resourceType": resourceType,
			"resourceName": name,
			"description":  "a resource with this name already exists under the parent",
		})
}

func (s *Sim) errUnauthenticated(msg string) *apiError {
	return s.newError(codeUnauthenticated, "Unauthenticated: "+msg)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	body, err := json.Marshal(v)
	if err != nil {
		http.Error(w, "encode response: "+err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, e)
}
