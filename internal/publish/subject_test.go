package publish_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/syncd-dev/syncd/internal/publish"
)

func TestEscapeToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"nginx", "nginx"},
		{"", "%"},
		{"team.a/web", "team%2Ea/web"},
		{"a*b>c", "a%2Ab%3Ec"},
		{"50%", "50%25"},
		{"%", "%25"},
		{"%25", "%2525"},
		{"white space\ttab\nnl", "white%20space%09tab%0Anl"},
		{"del\x7f", "del%7F"},
		{"ünïcode-名前", "ünïcode-名前"},
		{"a..b", "a%2E%2Eb"},
		{"$SYS", "$SYS"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got := publish.EscapeToken(tc.in)
			if got != tc.want {
				t.Fatalf("EscapeToken(%q) = %q, want %q", tc.in, got, tc.want)
			}
			back, err := publish.UnescapeToken(got)
			if err != nil {
				t.Fatalf("UnescapeToken(%q): %v", got, err)
			}
			if back != tc.in {
				t.Fatalf("UnescapeToken(%q) = %q, want %q", got, back, tc.in)
			}
			if subj := publish.Subject("syncd", "tag", "moved", tc.in); !server.IsValidLiteralSubject(subj) {
				t.Fatalf("Subject(..., %q) = %q is not a valid NATS subject", tc.in, subj)
			}
		})
	}
}

func TestUnescapeToken_Errors(t *testing.T) {
	for _, tok := range []string{"%2", "abc%", "%zz", "%%", "a%g1"} {
		if got, err := publish.UnescapeToken(tok); err == nil {
			t.Errorf("UnescapeToken(%q) = %q, want an error", tok, got)
		}
	}
}

func TestSubject(t *testing.T) {
	for _, tc := range []struct{ resource, action, scope, want string }{
		{"tag", "moved", "nginx", "syncd.tag.moved.nginx"},
		{"repo", "created", "team.a/python 3", "syncd.repo.created.team%2Ea/python%203"},
		{"advisory", "withdrawn", "openssl", "syncd.advisory.withdrawn.openssl"},
	} {
		if got := publish.Subject("syncd", tc.resource, tc.action, tc.scope); got != tc.want {
			t.Errorf("Subject(%s, %s, %q) = %q, want %q", tc.resource, tc.action, tc.scope, got, tc.want)
		}
	}
}

// FuzzEscapeToken checks, for any scope, that escaping gives one valid
// token of a literal NATS subject and that unescaping gives the scope back.
func FuzzEscapeToken(f *testing.F) {
	for _, s := range []string{"", "nginx", "a.b", "*", ">", "%", "%25", " ", "\x00", "\xff", "名前", "x.%2E*>\t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := publish.EscapeToken(s)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n\f\v\x00") {
			t.Fatalf("EscapeToken(%q) = %q is not a usable token", s, tok)
		}
		subj := publish.Subject("syncd", "tag", "moved", s)
		if !server.IsValidLiteralSubject(subj) {
			t.Fatalf("Subject for %q = %q is not a valid literal subject", s, subj)
		}
		if n := strings.Count(subj, "."); n != 3 {
			t.Fatalf("Subject for %q = %q has %d dots, want 3", s, subj, n)
		}
		if utf8.ValidString(s) && !utf8.ValidString(tok) {
			t.Fatalf("EscapeToken(%q) = %q broke UTF-8", s, tok)
		}
		back, err := publish.UnescapeToken(tok)
		if err != nil {
			t.Fatalf("UnescapeToken(%q): %v", tok, err)
		}
		if back != s {
			t.Fatalf("round trip of %q gave %q via %q", s, back, tok)
		}
	})
}
