package config

import "strings"

// redactURL hides the credentials in raw, a URL that may not even parse,
// for an error message: the password of its userinfo, or all of a lone
// user part, which NATS reads as a token. The userinfo is taken to be
// everything from after "//" (or from the start, when a typo lost it) to
// the last '@': more than the userinfo when a path holds an '@', which
// hides more than it must but never shows a password.
func redactURL(raw string) string {
	start := 0
	if i := strings.Index(raw, "//"); i >= 0 {
		start = i + 2
	}
	at := strings.LastIndexByte(raw[start:], '@')
	if at < 0 {
		return raw
	}
	userinfo := raw[start : start+at]
	shown := "xxxxx"
	if user, _, ok := strings.Cut(userinfo, ":"); ok {
		shown = user + ":xxxxx"
	}
	return raw[:start] + shown + raw[start+at:]
}
