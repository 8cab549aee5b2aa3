package config_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/config"
)

// TestLoad_Cleartext checks that every URL a token or the webhook keys
// travel over refuses http:// to a host other than loopback, accepts it
// on loopback, and accepts it anywhere with allow_insecure_http.
func TestLoad_Cleartext(t *testing.T) {
	for _, tc := range []struct {
		key     string
		file    func(url, extra string) string // the file setting key to url
		carries string
	}{
		{
			"platform.base_url",
			func(u, x string) string { return "[platform]\n" + x + "base_url = \"" + u + "\"\n" },
			"platform token",
		},
		{
			"platform.registry_url",
			func(u, x string) string { return "[platform]\n" + x + "registry_url = \"" + u + "\"\n" },
			"registry credential",
		},
		{"platform.sts_url", func(u, x string) string {
			return "[platform]\n" + x + "identity = \"org1/id\"\nidentity_token_file = \"/t\"\nsts_url = \"" + u + "\"\n"
		}, "external token"},
		{
			"events.issuer",
			func(u, x string) string { return "[platform]\n" + x + "[events]\nissuer = \"" + u + "\"\n" },
			"verify pushed events",
		},
	} {
		t.Run(tc.key, func(t *testing.T) {
			for _, u := range []string{"http://api.example.com", "http://10.0.0.7:8080", "http://[2001:db8::1]/", "http://127.0.0.1.example.com"} {
				_, err := config.Load(writeConfig(t, tc.file(u, "")), nil)
				var ce *config.Error
				if !errors.As(err, &ce) || ce.Key != tc.key || !strings.Contains(ce.Msg, "cleartext") ||
					!strings.Contains(ce.Msg, tc.carries) || !strings.Contains(ce.Msg, "allow_insecure_http") {
					t.Errorf(
						"%s: err=%v, want %s refused as cleartext carrying the %s, naming allow_insecure_http",
						u,
						err,
						tc.key,
						tc.carries,
					)
				}
			}
			for _, u := range []string{"http://127.0.0.1:8080", "http://[::1]:9000/", "http://localhost", "https://api.example.com"} {
				if _, err := config.Load(writeConfig(t, tc.file(u, "")), nil); err != nil {
					t.Errorf("%s: %v, want it accepted", u, err)
				}
			}
			if _, err := config.Load(writeConfig(t, tc.file("http://api.example.com", "allow_insecure_http = true\n")), nil); err != nil {
				t.Errorf("with allow_insecure_http = true: %v, want it accepted", err)
			}
		})
	}
	t.Run("FromEnvironment", func(t *testing.T) {
		env := []string{"SYNCD_PLATFORM_BASE_URL=http://api.example.com"}
		_, err := config.Load("", env)
		var ce *config.Error
		if !errors.As(err, &ce) || ce.Source != "SYNCD_PLATFORM_BASE_URL" {
			t.Fatalf("err=%v, want it to name SYNCD_PLATFORM_BASE_URL", err)
		}
		if _, err := config.Load("", append(env, "SYNCD_PLATFORM_ALLOW_INSECURE_HTTP=true")); err != nil {
			t.Fatalf("with SYNCD_PLATFORM_ALLOW_INSECURE_HTTP=true: %v", err)
		}
	})
}
