package platformsim

import (
	"encoding/json"
	"net/http"
	"sort"
	"strings"
	"unicode"
)

// fieldSet maps the camelCase name of each writable field to a setter; a
// nil raw value resets the field to its zero value (full replacement).
type fieldSet map[string]func(raw json.RawMessage) error

func stringField(p *string) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if raw == nil {
			*p = ""
			return nil
		}
		return json.Unmarshal(raw, p)
	}
}

func boolField(p *bool) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if raw == nil {
			*p = false
			return nil
		}
		return json.Unmarshal(raw, p)
	}
}

func listField(p *[]string) func(json.RawMessage) error {
	return func(raw json.RawMessage) error {
		if raw == nil {
			*p = nil
			return nil
		}
		var v []string
		if err := json.Unmarshal(raw, &v); err != nil {
			return err
		}
		*p = v
		return nil
	}
}

// outputOnly fields may appear in a body (a client echoing a resource back)
// and are ignored, as the upstream ignores output-only fields.
func outputOnly(name string) bool {
	switch name {
	case "uid", "createTime", "updateTime", "lastSeenTime":
		return true
	}
	return false
}

// camelCase turns a snake_case field path into the JSON name, since masks
// may use either spelling.
func camelCase(s string) string {
	var b strings.Builder
	up := false
	for _, r := range s {
		if r == '_' {
			up = true
			continue
		}
		if up {
			r = unicode.ToUpper(r)
			up = false
		}
		b.WriteRune(r)
	}
	return b.String()
}

// parseMask reads the updateMask query parameter: nil when absent, a set
// holding "*" for full replacement.
func (s *Sim) parseMask(r *http.Request) (map[string]bool, *apiError) {
	q := r.URL.Query()
	v, ok := q["updateMask"]
	if !ok {
		v, ok = q["update_mask"]
	}
	if !ok {
		return nil, nil
	}
	mask := map[string]bool{}
	for _, part := range v {
		for _, f := range strings.Split(part, ",") {
			if f = strings.TrimSpace(f); f != "" {
				mask[camelCase(f)] = true
			}
		}
	}
	return mask, nil
}

// applyFields performs the update rules: without a mask, the fields present
// in the body; with a mask, only the masked fields (others in the body are
// ignored); with "*", every writable field, absent ones being cleared.
func (s *Sim) applyFields(fs fieldSet, body map[string]json.RawMessage, mask map[string]bool) *apiError {
	var names []string
	switch {
	case mask == nil:
		for k := range body {
			if outputOnly(k) {
				continue
			}
			if _, ok := fs[k]; !ok {
				return s.errInvalid(k, "unknown or read-only field")
			}
			names = append(names, k)
		}
	case mask["*"]:
		for k := range fs {
			names = append(names, k)
		}
	default:
		for k := range mask {
			if _, ok := fs[k]; !ok {
				return s.errInvalid("updateMask", "unknown or read-only field "+k)
			}
			names = append(names, k)
		}
	}
	sort.Strings(names)
	for _, k := range names {
		if err := fs[k](body[k]); err != nil {
			return s.errInvalid(k, "wrong type: "+err.Error())
		}
	}
	return nil
}
