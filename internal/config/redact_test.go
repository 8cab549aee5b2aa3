package config_test

import (
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/config"
)

// TestLoad_ErrorsHideURLPasswords: a URL that fails validation is shown in
// the error with its userinfo's password (or a lone user part, which NATS
// reads as a token) replaced, whether it came from the file or the
// environment, and whether or not it parses as a URL at all.
func TestLoad_ErrorsHideURLPasswords(t *testing.T) {
	const secret = "s3cret"
	for _, tc := range []struct {
		name, file, env, key, shown string
	}{
		{
			"NATSMissingColon",
			"[nats]\nurl = \"nats//syncd:s3cret@nats.example.com:4222\"\n",
			"",
			"nats.url",
			"nats//syncd:xxxxx@nats.example.com:4222",
		},
		{"NATSWrongScheme", "[nats]\nurl = \"http://syncd:s3cret@nats.example.com:4222\"\n", "", "nats.url", "http://syncd:xxxxx@nats.example.com:4222"},
		{
			"NATSTokenAsUser",
			"[nats]\nurl = \"nats://127.0.0.1:4222,ntas:/s3cret@nats.example.com\"\n",
			"",
			"nats.url",
			"ntas:xxxxx@nats.example.com",
		},
		{
			"NATSFromEnv",
			"",
			"SYNCD_NATS_URL=nats:/syncd:s3cret@nats.example.com:4222",
			"nats.url",
			"nats:xxxxx@nats.example.com:4222",
		},
		{
			"BaseURL",
			"[platform]\nbase_url = \"ftp://me:s3cret@api.example.com\"\n",
			"",
			"platform.base_url",
			"ftp://me:xxxxx@api.example.com",
		},
		{"SinkURL", "[events]\nlisten = \"127.0.0.1:0\"\nissuer = \"https://issuer.example.com\"\nsink_url = \"http://me:s3cret@hooks.example.com/x\"\n", "", "events.sink_url", "http://me:xxxxx@hooks.example.com/x"},
		{"Unparsable", "[events]\nissuer = \"https://me:s3cret@exa mple.com/%zz\"\n", "", "events.issuer", "https://me:xxxxx@exa mple.com/%zz"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeConfig(t, tc.file)
			}
			var env []string
			if tc.env != "" {
				env = []string{tc.env}
			}
			_, err := config.Load(path, env)
			if err == nil {
				t.Fatal("Load succeeded, want an error")
			}
			msg := err.Error()
			if strings.Contains(msg, secret) {
				t.Errorf("the error shows the password: %s", msg)
			}
			if !strings.Contains(msg, tc.key) || !strings.Contains(msg, tc.shown) {
				t.Errorf("error %q, want it to name %s and show %q", msg, tc.key, tc.shown)
			}
		})
	}
}
