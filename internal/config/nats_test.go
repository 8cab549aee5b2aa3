package config_test

import (
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/config"
)

// TestNATS_ExampleMatchesDefault checks that config.example.toml documents
// every [nats] key with its default value: loading it must give Default().
func TestNATS_ExampleMatchesDefault(t *testing.T) {
	cfg, err := config.Load(filepath.Join("..", "..", "config.example.toml"), nil)
	if err != nil {
		t.Fatalf("load example: %v", err)
	}
	if got, want := cfg.NATS, config.Default().NATS; !reflect.DeepEqual(got, want) {
		t.Fatalf("example [nats] = %+v, want the defaults %+v", got, want)
	}
	src, err := os.ReadFile(filepath.Join("..", "..", "config.example.toml"))
	if err != nil {
		t.Fatal(err)
	}
	typ := reflect.TypeFor[config.NATS]()
	for i := 0; i < typ.NumField(); i++ {
		key := typ.Field(i).Tag.Get("toml")
		if !strings.Contains(string(src), "\n"+key+" = ") {
			t.Errorf("config.example.toml does not document nats.%s", key)
		}
	}
}

func TestNATS_Validate(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	missing := filepath.Join(dir, "missing")
	external := func(f func(n *config.NATS)) func(n *config.NATS) {
		return func(n *config.NATS) { n.URL = "nats://127.0.0.1:4222"; f(n) }
	}
	for _, tc := range []struct {
		name    string
		set     func(n *config.NATS)
		wantKey string // "" means valid
		wantMsg string
	}{
		{"Defaults", func(*config.NATS) {}, "", ""},
		{"UserPassword", external(func(n *config.NATS) { n.User, n.Password = "u", "p" }), "", ""},
		{
			"TokenAndTLS",
			external(func(n *config.NATS) { n.Token, n.TLSCA, n.TLSCert, n.TLSKey = "t", file, file, file }),
			"",
			"",
		},
		{"Credentials", external(func(n *config.NATS) { n.Credentials = file }), "", ""},
		{"ManageStreamOffReplicas3", external(func(n *config.NATS) { n.ManageStream, n.Replicas = false, 3 }), "", ""},
		{
			"CredentialsMissing",
			external(func(n *config.NATS) { n.Credentials = missing }),
			"nats.credentials",
			"no such file",
		},
		{"NKeySeedMissing", external(func(n *config.NATS) { n.NKeySeed = missing }), "nats.nkey_seed", "no such file"},
		{"TLSCADirectory", external(func(n *config.NATS) { n.TLSCA = dir }), "nats.tls_ca", "is a directory"},
		{"TLSCertWithoutKey", external(func(n *config.NATS) { n.TLSCert = file }), "nats.tls_cert", "come together"},
		{"TLSKeyWithoutCert", external(func(n *config.NATS) { n.TLSKey = file }), "nats.tls_key", "come together"},
		{
			"TLSKeyMissing",
			external(func(n *config.NATS) { n.TLSCert, n.TLSKey = file, missing }),
			"nats.tls_key",
			"no such file",
		},
		{"PasswordWithoutUser", external(func(n *config.NATS) { n.Password = "p" }), "nats.password", "come together"},
		{"UserWithoutPassword", external(func(n *config.NATS) { n.User = "u" }), "nats.user", "come together"},
		{
			"TwoAuthMethods",
			external(func(n *config.NATS) { n.Token, n.Credentials = "t", file }),
			"nats.token",
			"only one way",
		},
		{"ReplicasZero", external(func(n *config.NATS) { n.Replicas = 0 }), "nats.replicas", "between 1 and 5"},
		{"ReplicasSix", external(func(n *config.NATS) { n.Replicas = 6 }), "nats.replicas", "between 1 and 5"},
		{"EmbeddedReplicas", func(n *config.NATS) { n.Replicas = 3 }, "nats.replicas", "embedded"},
		{"EmbeddedToken", func(n *config.NATS) { n.Token = "t" }, "nats.token", "nats.url"},
		{"ListenAllInterfaces", func(n *config.NATS) { n.Listen = "0.0.0.0:4222" }, "nats.listen", "not a loopback address"},
		{"ListenAnyHost", func(n *config.NATS) { n.Listen = ":4222" }, "nats.listen", "not a loopback address"},
		{"ListenLANAddress", func(n *config.NATS) { n.Listen = "10.1.2.3:4222" }, "nats.listen", "listen_public"},
		{
			"ListenPublicWithoutCredentials",
			func(n *config.NATS) { n.Listen, n.ListenPublic = "0.0.0.0:4222", true },
			"nats.listen_public",
			"requires credentials",
		},
		{
			"ListenPublicWithToken",
			func(n *config.NATS) { n.Listen, n.ListenPublic, n.Token = "0.0.0.0:4222", true, "t" },
			"",
			"",
		},
		{
			"ListenPublicWithUserPassword",
			func(n *config.NATS) { n.Listen, n.ListenPublic, n.User, n.Password = "[::]:4222", true, "u", "p" },
			"",
			"",
		},
		{"ListenLoopbackWithToken", func(n *config.NATS) { n.Listen, n.Token = "127.0.0.1:4222", "t" }, "", ""},
		{"ListenLocalhost", func(n *config.NATS) { n.Listen = "localhost:4222" }, "", ""},
		{
			"ListenUserWithoutPassword",
			func(n *config.NATS) { n.Listen, n.User = "127.0.0.1:4222", "u" },
			"nats.user",
			"come together",
		},
		{
			"ListenCredentialsFile",
			func(n *config.NATS) { n.Listen, n.Credentials = "127.0.0.1:4222", file },
			"nats.credentials",
			"nats.url",
		},
		{"ListenPublicWithURL", external(func(n *config.NATS) { n.ListenPublic = true }), "nats.listen_public", "embedded"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			tc.set(&cfg.NATS)
			err := cfg.Validate()
			if tc.wantKey == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("Validate() = %v, want a *config.Error", err)
			}
			if got, want := ce.Key, tc.wantKey; got != want {
				t.Errorf("key = %q, want %q (%v)", got, want, err)
			}
			if !strings.Contains(ce.Msg, tc.wantMsg) {
				t.Errorf("message %q does not say %q", ce.Msg, tc.wantMsg)
			}
		})
	}
}

// TestNATS_SecretsFromEnv checks that the secrets can come from the
// environment and that manage_stream = false survives the defaults.
func TestNATS_SecretsFromEnv(t *testing.T) {
	path := filepath.Join(t.TempDir(), "syncd.toml")
	if err := os.WriteFile(
		path,
		[]byte("[nats]\nurl = \"nats://127.0.0.1:4222\"\nmanage_stream = false\nuser = \"syncd\"\n"),
		0o600,
	); err != nil {
		t.Fatal(err)
	}
	cfg, err := config.Load(path, []string{"SYNCD_NATS_PASSWORD=s3cret"})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if got, want := cfg.NATS.Password, "s3cret"; got != want {
		t.Errorf("password = %q, want %q", got, want)
	}
	if cfg.NATS.ManageStream {
		t.Errorf("manage_stream = true, want false from the file")
	}
	// Without the password the file is invalid, and the error points at the line.
	_, err = config.Load(path, nil)
	if err == nil || !strings.Contains(err.Error(), "syncd.toml:4: nats.user: set nats.password too") {
		t.Fatalf("Load without password = %v, want an error at syncd.toml:4 naming nats.user and nats.password", err)
	}
}
