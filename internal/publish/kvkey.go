package publish

import (
	"fmt"
	"strconv"
	"strings"
)

// KV keys allow only [-/_=.a-zA-Z0-9], and '.' separates tokens that
// watch filters match ("nginx.*"). EscapeKeyToken makes any string one
// token of such a key, reversibly, as EscapeToken does for subjects but
// with '=' as the escape character, since '%' is not allowed in a key.

// EscapeKeyToken makes s usable as one token of a KV key, reversibly:
// letters, digits, '-', '_' and '/' stay as they are; every other byte,
// '.' and the escape character '=' included, becomes =XX (the byte in
// uppercase hex). The empty string becomes "=", which no escaped string
// can be. A repo path keeps its slashes (charts/cert-manager), a tag 1.27
// becomes 1=2E27.
func EscapeKeyToken(s string) string {
	if s == "" {
		return "="
	}
	if !strings.ContainsFunc(s, func(r rune) bool { return r > 0x7f || keyEscaped(byte(r)) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if keyEscaped(c) {
			fmt.Fprintf(&b, "=%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// keyEscaped reports whether EscapeKeyToken escapes c.
func keyEscaped(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '_', c == '/':
		return false
	}
	return true
}

// UnescapeKeyToken reverses EscapeKeyToken.
func UnescapeKeyToken(tok string) (string, error) {
	if tok == "=" {
		return "", nil
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] != '=' {
			b.WriteByte(tok[i])
			continue
		}
		if i+3 > len(tok) {
			return "", fmt.Errorf("key token %q: truncated escape at byte %d", tok, i)
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("key token %q: bad escape %q", tok, tok[i:i+3])
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// TagKey is the key of a tag in the tags bucket: <repo path>.<tag>, each
// escaped with EscapeKeyToken, so that "<repo path>.*" watches a repo.
func TagKey(repoPath, tag string) string {
	return EscapeKeyToken(repoPath) + "." + EscapeKeyToken(tag)
}

// MaturedKey is the key of a tag's matured digest for an age in the
// matured bucket: <repo path>.<tag>.<age>, each escaped with
// EscapeKeyToken, so that "<repo path>.<tag>.*" watches a tag's ages and
// "*.*.72h" one age.
func MaturedKey(repoPath, tag, age string) string {
	return TagKey(repoPath, tag) + "." + EscapeKeyToken(age)
}

// RepoKey is the key of a repo in the repos bucket: its escaped path.
func RepoKey(repoPath string) string { return EscapeKeyToken(repoPath) }

// AdvisoryKey is the key of an advisory in the advisories bucket: its
// escaped advisory id (CGA-xxxx-xxxx-xxxx).
func AdvisoryKey(advisoryID string) string { return EscapeKeyToken(advisoryID) }

// SplitTagKey returns the repo path and tag of a tags bucket key.
func SplitTagKey(key string) (repoPath, tag string, err error) {
	p, t, ok := strings.Cut(key, ".")
	if !ok || strings.Contains(t, ".") {
		return "", "", fmt.Errorf("tag key %q: want <repo path>.<tag>", key)
	}
	if repoPath, err = UnescapeKeyToken(p); err != nil {
		return "", "", err
	}
	if tag, err = UnescapeKeyToken(t); err != nil {
		return "", "", err
	}
	return repoPath, tag, nil
}
