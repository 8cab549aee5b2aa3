package config

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"strings"
)

// Error is a configuration problem tied to one key.
type Error struct {
	Key    string // dotted key, e.g. "nats.url"
	Source string // file name or environment variable; empty for a default
	Line   int    // line in Source, 0 when unknown
	Msg    string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Key != "" {
		fmt.Fprintf(&b, "%s: ", e.Key)
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Errors is every problem one Load, Validate or RequirePlatform found, so
// that an operator fixes them all in one round. Load orders them by line,
// then those from the environment and the defaults. errors.As with a
// *Error finds the first.
type Errors []*Error

// Error lists the problems one per line.
func (es Errors) Error() string {
	if len(es) == 1 {
		return es[0].Error()
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d configuration errors:", len(es))
	for _, e := range es {
		b.WriteString("\n  ")
		b.WriteString(e.Error())
	}
	return b.String()
}

// Unwrap gives errors.Is and errors.As every problem, first to last.
func (es Errors) Unwrap() []error {
	out := make([]error, len(es))
	for i, e := range es {
		out[i] = e
	}
	return out
}

// problems collects what a validation finds.
type problems struct{ errs Errors }

func (p *problems) addf(key, format string, args ...any) {
	p.errs = append(p.errs, &Error{Key: key, Msg: fmt.Sprintf(format, args...)})
}

// err is nil when nothing was found: never an empty Errors, which would be
// a non-nil error saying nothing.
func (p *problems) err() error {
	if len(p.errs) == 0 {
		return nil
	}
	return p.errs
}

// locate points each problem without a source at where its key was set:
// the environment variable that overrode it (fromEnv), else its line in
// the file at path, and then orders them by line, so that the list reads
// like the file.
func (es Errors) locate(path string, src []byte, fromEnv map[string]string) {
	for _, e := range es {
		if e.Source != "" || e.Key == "" {
			continue
		}
		if name, ok := fromEnv[e.Key]; ok {
			e.Source = name
		} else if line := keyLine(src, e.Key); path != "" && line > 0 {
			e.Source, e.Line = path, line
		}
	}
	rank := func(e *Error) int {
		if path != "" && e.Source == path && e.Line > 0 {
			return e.Line
		}
		return math.MaxInt
	}
	slices.SortStableFunc(es, func(a, b *Error) int { return cmp.Compare(rank(a), rank(b)) })
}
