package config_test

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
)

func writeConfig(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "syncd.toml")
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoad_Defaults(t *testing.T) {
	cfg, err := config.Load("", nil)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.NATS.SubjectPrefix, "syncd"; got != want {
		t.Errorf("subject_prefix=%q, want %q", got, want)
	}
	if got, want := cfg.Store.Path, "data/syncd.db"; got != want {
		t.Errorf("store.path=%q, want %q", got, want)
	}
	if got, want := cfg.Crawl.Concurrency, 4; got != want {
		t.Errorf("concurrency=%d, want %d", got, want)
	}
	// Prometheus listens on 9090 and its exporters hold 9091-9999: the
	// admin listener must run beside them on the same host.
	_, port, err := net.SplitHostPort(cfg.Admin.Listen)
	if err != nil {
		t.Fatalf("admin.listen=%q: %v", cfg.Admin.Listen, err)
	}
	if p, _ := strconv.Atoi(port); p >= 9090 && p <= 9999 {
		t.Errorf("admin.listen=%q: port %d is in the range of Prometheus and its exporters", cfg.Admin.Listen, p)
	}
}

// The example file documents every key with its default, so loading it must
// give exactly Default().
func TestLoad_ExampleIsDefaults(t *testing.T) {
	cfg, err := config.Load("../../config.example.toml", nil)
	if err != nil {
		t.Fatal(err)
	}
	def := config.Default()
	// TOML cannot write nil slices; empty ones are the same setting.
	cfg.Crawl.Include, cfg.Crawl.Exclude, cfg.Crawl.PublicImages = nil, nil, nil
	cfg.Cluster.VerifyKeys = nil
	if got, want := cfg, def; !reflect.DeepEqual(got, want) {
		t.Fatalf("config.example.toml differs from the defaults:\n got %+v\nwant %+v", got, want)
	}
}

func TestLoad_FileAndEnv(t *testing.T) {
	p := writeConfig(t, `
[platform]
base_url = "https://api.example.com"
registry_url = "https://cgr.example.com"
group = "g1"

[crawl]
schedule = "@every 5m"
include = ["nginx", "redis*"]

[nats]
url = "nats://127.0.0.1:4222"
`)
	cfg, err := config.Load(
		p,
		[]string{
			"SYNCD_NATS_SUBJECT_PREFIX=acme.syncd",
			"SYNCD_CRAWL_CONCURRENCY=8",
			"SYNCD_CRAWL_EXCLUDE=a, b",
			"SYNCD_STORE_EVENT_RETENTION=48h",
			"HOME=/root",
		},
	)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := cfg.Platform.BaseURL, "https://api.example.com"; got != want {
		t.Errorf("base_url=%q, want %q", got, want)
	}
	if got, want := cfg.NATS.SubjectPrefix, "acme.syncd"; got != want {
		t.Errorf("subject_prefix=%q, want %q (env overrides file)", got, want)
	}
	if got, want := cfg.Crawl.Concurrency, 8; got != want {
		t.Errorf("concurrency=%d, want %d", got, want)
	}
	if got, want := strings.Join(cfg.Crawl.Exclude, "|"), "a|b"; got != want {
		t.Errorf("exclude=%q, want %q", got, want)
	}
	if got, want := strings.Join(cfg.Crawl.Include, "|"), "nginx|redis*"; got != want {
		t.Errorf("include=%q, want %q", got, want)
	}
	if got, want := cfg.Store.EventRetention.Duration, 48*time.Hour; got != want {
		t.Errorf("event_retention=%v, want %v", got, want)
	}
}

func TestLoad_Errors(t *testing.T) {
	for _, tc := range []struct {
		name, file string
		env        []string
		key        string
		line       int
		msg        string
	}{
		{
			name: "UnknownKey",
			file: "[nats]\nurl = \"nats://x:1\"\nbogus = 1\n",
			key:  "nats.bogus",
			line: 3,
			msg:  "unknown key",
		},
		{name: "UnknownSection", file: "[natz]\nurl = 1\n", key: "natz", line: 1, msg: "unknown key"},
		{name: "Malformed", file: "[nats\nurl = 1\n", line: 2}, // the decoder notices at the newline
		{
			name: "BadURL",
			file: "[platform]\n\nbase_url = \"ftp//x\"\n",
			key:  "platform.base_url",
			line: 3,
			msg:  "not an http(s) URL",
		},
		{
			name: "BadSchedule",
			file: "[crawl]\nschedule = \"every tuesday\"\n",
			key:  "crawl.schedule",
			line: 2,
			msg:  "unparsable schedule",
		},
		{
			name: "WrongType",
			file: "[crawl]\nconcurrency = \"four\"\n",
			key:  "crawl.concurrency",
			line: 2,
			msg:  "incompatible types",
		},
		{
			name: "BadDuration",
			file: "[store]\nevent_retention = \"a week\"\n",
			key:  "store.event_retention",
			line: 2,
			msg:  "not a duration",
		},
		{
			name: "TwoTokens",
			file: "[platform]\ntoken = \"a\"\ntoken_file = \"/f\"\n",
			key:  "platform.token",
			line: 2,
			msg:  "only one",
		},
		{
			name: "TwoRegistryCredentials",
			file: "[platform]\nregistry_token = \"a\"\nregistry_credential_helper = \"cgr\"\n",
			key:  "platform.registry_credential_helper",
			line: 3,
			msg:  "only one registry credential",
		},
		{
			name: "HelperWithPath",
			file: "[platform]\nregistry_credential_helper = \"/usr/bin/docker-credential-cgr\"\n",
			key:  "platform.registry_credential_helper",
			line: 2,
			msg:  "docker-credential-<name>",
		},
		{
			name: "IdentityAndToken",
			file: "[platform]\nidentity = \"org1/abc\"\nidentity_token_file = \"/t\"\ntoken_command = \"x\"\n",
			key:  "platform.token_command",
			line: 4,
			msg:  "both audiences",
		},
		{
			name: "IdentityAndRegistryToken",
			file: "[platform]\nidentity = \"org1/abc\"\nidentity_token_file = \"/t\"\nregistry_token_file = \"/r\"\n",
			key:  "platform.registry_token_file",
			line: 4,
			msg:  "remove platform.registry_token_file",
		},
		{
			name: "IdentityWithoutTokenFile",
			file: "[platform]\nidentity = \"org1/abc\"\n",
			key:  "platform.identity_token_file",
			msg:  "required with platform.identity",
		},
		{
			name: "TokenFileWithoutIdentity",
			file: "[platform]\nidentity_token_file = \"/t\"\n",
			key:  "platform.identity_token_file",
			line: 2,
			msg:  "only applies with platform.identity",
		},
		{
			name: "BadSTSURL",
			file: "[platform]\nidentity = \"org1/abc\"\nidentity_token_file = \"/t\"\nsts_url = \"issuer\"\n",
			key:  "platform.sts_url",
			line: 4,
			msg:  "not an http(s) URL",
		},
		{
			name: "UnknownTagFamily",
			file: "[crawl]\ntag_families = [\"dates\", \"weeks\"]\n",
			key:  "crawl.tag_families",
			line: 2,
			msg:  "unknown tag family \"weeks\"",
		},
		{name: "BadNATSURL", file: "[nats]\nurl = \"http://x\"\n", key: "nats.url", line: 2, msg: "not a NATS URL"},
		{name: "BadInitialEvents", file: "[store]\ninitial_events = \"all\"\n", key: "store.initial_events", line: 2},
		{name: "EnvBadInt", env: []string{"SYNCD_CRAWL_CONCURRENCY=many"}, key: "crawl.concurrency", msg: "not an integer"},
		{name: "EnvUnknown", env: []string{"SYNCD_NATS_UR=nats://x:1"}, msg: "unknown environment override"},
		{name: "EnvInvalid", env: []string{"SYNCD_CRAWL_SCHEDULE=soon"}, key: "crawl.schedule", msg: "unparsable"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := ""
			if tc.file != "" {
				path = writeConfig(t, tc.file)
			}
			_, err := config.Load(path, tc.env)
			var ce *config.Error
			if !errors.As(err, &ce) {
				t.Fatalf("err=%v, want a *config.Error", err)
			}
			if ce.Key != tc.key {
				t.Errorf("key=%q, want %q (err: %v)", ce.Key, tc.key, err)
			}
			if ce.Line != tc.line {
				t.Errorf("line=%d, want %d (err: %v)", ce.Line, tc.line, err)
			}
			if !strings.Contains(err.Error(), tc.msg) {
				t.Errorf("err=%q, want it to say %q", err, tc.msg)
			}
		})
	}
}

func TestRequirePlatform(t *testing.T) {
	cfg := config.Default()
	err := cfg.RequirePlatform()
	var ce *config.Error
	if !errors.As(err, &ce) || ce.Key != "platform.base_url" {
		t.Fatalf("err=%v, want one naming platform.base_url", err)
	}
	cfg.Platform = config.Platform{
		BaseURL:      "https://a",
		RegistryURL:  "https://r",
		Group:        "g",
		Organization: "o",
		TokenFile:    "/t",
	}
	if err := cfg.RequirePlatform(); err != nil {
		t.Fatal(err)
	}
}

// FuzzLoad feeds arbitrary files to Load: it must return a config or an
// error, never panic.
func FuzzLoad(f *testing.F) {
	b, err := os.ReadFile("../../config.example.toml")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(b))
	f.Add("[nats]\nurl = \"nats://x:1\"\nbogus = 1\n")
	f.Add("[crawl]\nschedule = \"@every 1s\"\ninclude = [1, 2]\n")
	f.Add("[[platform]]\n")
	f.Add("x = \"\\u0000\"")
	f.Fuzz(func(t *testing.T, body string) {
		p := filepath.Join(t.TempDir(), "f.toml")
		if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
		cfg, err := config.Load(p, nil)
		if err == nil {
			if verr := cfg.Validate(); verr != nil {
				t.Fatalf("Load accepted a config that does not validate: %v", verr)
			}
		}
	})
}
