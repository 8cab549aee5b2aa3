package publish

import (
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// EscapeToken makes s usable as one token of a NATS subject, reversibly:
// '.', '*', '>', whitespace and other control bytes, and the escape
// character '%' itself become %XX (the byte in uppercase hex), as in URL
// encoding. The empty string becomes "%", which no escaped string can be.
func EscapeToken(s string) string {
	if s == "" {
		return "%"
	}
	if !strings.ContainsFunc(s, func(r rune) bool { return r < utf8.RuneSelf && escaped(byte(r)) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if escaped(c) {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// escaped reports whether EscapeToken escapes c.
func escaped(c byte) bool {
	return c <= ' ' || c == 0x7f || c == '.' || c == '*' || c == '>' || c == '%'
}

// UnescapeToken reverses EscapeToken.
func UnescapeToken(tok string) (string, error) {
	if tok == "%" {
		return "", nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] != '%' {
			b.WriteByte(tok[i])
			continue
		}
		if i+3 > len(tok) {
			return "", fmt.Errorf("subject token %q: truncated escape at byte %d", tok, i)
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("subject token %q: bad escape %q", tok, tok[i:i+3])
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// Subject is where an event is published: <prefix>.<resource>.<action>.<scope>.
func Subject(prefix, resource, action, scope string) string {
	return prefix + "." + resource + "." + action + "." + EscapeToken(scope) // one allocation
}
