package main

import (
	"context"
	"fmt"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/testutil"
)

const checkRegistryToken = "check-registry-token-5e1d"

// checkWorld is a strict simulator with nested repos, which accepts
// e2eToken at the API and checkRegistryToken at the registry.
func checkWorld(t *testing.T) (*platformsim.Sim, string) {
	t.Helper()
	sim := platformsim.New(
		platformsim.Options{Seed: 41, Strict: true, Tokens: []string{e2eToken}, RegistryTokens: []string{checkRegistryToken}},
	)
	sim.Populate(platformsim.Scale{Repos: 2, TagsPerRepo: 1, HistoryPerTag: 2, NestedRepos: 2})
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(sim.Close)
	sim.SetBaseURL(srv.URL)
	return sim, srv.URL
}

// runCheck runs "syncd check" on cfg and returns its exit code, its lines
// by subject ("platform API", "registry", "NATS", "config"), and stderr.
func runCheck(t *testing.T, cfg string, flags ...string) (int, map[string]string, string) {
	t.Helper()
	code, stdout, stderr := runMain(
		context.Background(),
		append([]string{"check", "--config", cfg, "--timeout", "10s"}, flags...)...)
	t.Logf("stdout:\n%s\nstderr:\n%s", stdout, stderr)
	lines := map[string]string{}
	for _, l := range strings.Split(strings.TrimSpace(stdout), "\n") {
		for _, subject := range []string{"config", "platform API", "registry", "NATS"} {
			if strings.Contains(l, "  "+subject+" ") {
				lines[subject] = l
			}
		}
	}
	for _, secret := range []string{e2eToken, checkRegistryToken, "wrong-registry-token"} {
		if strings.Contains(stdout+stderr, secret) {
			t.Errorf("the output holds a token:\n%s%s", stdout, stderr)
		}
	}
	return code, lines, stderr
}

func wantVerdict(t *testing.T, lines map[string]string, subject, verdict string, says ...string) {
	t.Helper()
	l, ok := lines[subject]
	if !ok || !strings.HasPrefix(l, verdict+" ") {
		t.Errorf("%s: line %q, want it to start with %q (all lines: %q)", subject, l, verdict, lines)
		return
	}
	for _, s := range says {
		if !strings.Contains(l, s) {
			t.Errorf("%s: line %q does not say %q", subject, l, s)
		}
	}
}

func TestCheck(t *testing.T) {
	sim, simURL := checkWorld(t)
	ns := testutil.NATS(t)
	registryAudience := strings.TrimPrefix(simURL, "http://")
	config := func(t *testing.T, natsURL, credentials string) (path, dbPath string) {
		dbPath = filepath.Join(t.TempDir(), "syncd.db")
		return testConfig{simURL: simURL, natsURL: natsURL, dbPath: dbPath, credentials: credentials}.write(t), dbPath
	}
	tokens := fmt.Sprintf("token = %q\nregistry_token = %q", e2eToken, checkRegistryToken)

	t.Run("AllGood", func(t *testing.T) {
		cfg, dbPath := config(t, ns.URL(), tokens)
		code, lines, stderr := runCheck(t, cfg)
		if code != exitOK {
			t.Fatalf("exit=%d, want 0; lines %q; stderr %s", code, lines, stderr)
		}
		wantVerdict(t, lines, "config", "ok")
		wantVerdict(t, lines, "platform API", "ok", "platform.token", "group org1 is readable")
		wantVerdict(
			t,
			lines,
			"registry",
			"ok",
			"platform.registry_token",
			"audience "+registryAudience,
			"tag history of acme/",
		)
		wantVerdict(t, lines, "NATS", "ok", "JetStream answers")
		if _, err := os.Stat(dbPath); !os.IsNotExist(err) {
			t.Errorf("stat %s: %v; check must not create the mirror", dbPath, err)
		}
	})

	t.Run("WrongRegistryToken", func(t *testing.T) {
		cfg, _ := config(t, ns.URL(), fmt.Sprintf("token = %q\nregistry_token = \"wrong-registry-token\"", e2eToken))
		code, lines, stderr := runCheck(t, cfg)
		if code != exitFailure {
			t.Fatalf("exit=%d, want 1; lines %q; stderr %s", code, lines, stderr)
		}
		wantVerdict(t, lines, "platform API", "ok")
		wantVerdict(
			t,
			lines,
			"registry",
			"FAIL",
			"platform.registry_token",
			"refused the registry token for audience "+registryAudience,
			"set registry_token_command = 'chainctl auth token --audience "+registryAudience+"'",
		)
		wantVerdict(t, lines, "NATS", "ok")
		if !strings.Contains(stderr, "1 of 3 checks failed") {
			t.Errorf("stderr %q, want it to count the failures", stderr)
		}
	})

	t.Run("PlatformTokenAtRegistry", func(t *testing.T) {
		cfg, _ := config(t, ns.URL(), fmt.Sprintf("token = %q", e2eToken))
		code, lines, _ := runCheck(t, cfg)
		if code != exitFailure {
			t.Fatalf("exit=%d, want 1; lines %q", code, lines)
		}
		wantVerdict(
			t,
			lines,
			"registry",
			"FAIL",
			"no registry credential",
			"a platform token was given where a registry token is needed",
		)
	})

	t.Run("NATSUnreachable", func(t *testing.T) {
		cfg, _ := config(t, "nats://127.0.0.1:1", tokens)
		code, lines, stderr := runCheck(t, cfg)
		if code != exitFailure {
			t.Fatalf("exit=%d, want 1; lines %q; stderr %s", code, lines, stderr)
		}
		wantVerdict(t, lines, "platform API", "ok")
		wantVerdict(t, lines, "registry", "ok")
		wantVerdict(t, lines, "NATS", "FAIL", "connect to NATS", "nats.url")
	})

	t.Run("IdentityAndEmbeddedNATS", func(t *testing.T) {
		const subject = "system:serviceaccount:syncd:check"
		identity := createIdentity(t, simURL, sim.ExternalIssuer(), subject)
		ext, err := sim.ExternalToken(subject, "", 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		creds := fmt.Sprintf(
			"identity = %q\nidentity_token_file = %q\nsts_url = %q",
			identity,
			writeFile(t, "external-token", ext),
			simURL,
		)
		cfg, _ := config(t, "", creds)
		code, lines, stderr := runCheck(t, cfg)
		if code != exitOK {
			t.Fatalf("exit=%d, want 0; lines %q; stderr %s", code, lines, stderr)
		}
		wantVerdict(t, lines, "platform API", "ok", "token of identity "+identity, "audience "+simURL)
		wantVerdict(t, lines, "registry", "ok", "token of identity "+identity, "audience "+registryAudience)
		wantVerdict(t, lines, "NATS", "skip", "embedded")

		// An external token the identity does not accept fails both
		// exchanges, each naming its audience.
		other, err := sim.ExternalToken("system:serviceaccount:other:other", "", 10*time.Minute)
		if err != nil {
			t.Fatal(err)
		}
		creds = fmt.Sprintf(
			"identity = %q\nidentity_token_file = %q\nsts_url = %q",
			identity,
			writeFile(t, "external-token", other),
			simURL,
		)
		cfg, _ = config(t, "", creds)
		code, lines, _ = runCheck(t, cfg)
		if code != exitFailure {
			t.Fatalf("exit=%d, want 1; lines %q", code, lines)
		}
		wantVerdict(t, lines, "platform API", "FAIL", "refused the identity exchange of "+identity+" for audience "+simURL)
		wantVerdict(
			t,
			lines,
			"registry",
			"FAIL",
			"could not obtain the credential",
			"refused the identity exchange of "+identity+" for audience "+registryAudience,
		)
	})

	t.Run("PlatformUnreachable", func(t *testing.T) {
		cfg := testConfig{
			simURL:      "http://127.0.0.1:1",
			natsURL:     ns.URL(),
			dbPath:      filepath.Join(t.TempDir(), "syncd.db"),
			credentials: tokens,
		}.write(
			t,
		)
		code, lines, _ := runCheck(t, cfg, "--timeout", "1s")
		if code != exitFailure {
			t.Fatalf("exit=%d, want 1; lines %q", code, lines)
		}
		wantVerdict(t, lines, "platform API", "FAIL", "no answer came", "check platform.base_url")
		wantVerdict(t, lines, "registry", "skip", "the credential was obtained, but not presented", "that check failed")
		wantVerdict(t, lines, "NATS", "ok")
	})

	t.Run("ConfigErrors", func(t *testing.T) {
		cfg := writeFile(
			t,
			"syncd.toml",
			"[platform]\nbase_url = \"http://platform.example.com\"\n\n[crawl]\nschedule = \"@every 0s\"\nconcurrency = 0\n",
		)
		code, stdout, stderr := runMain(context.Background(), "check", "--config", cfg)
		if code != exitUsage {
			t.Fatalf("exit=%d, want 2; stdout %s; stderr %s", code, stdout, stderr)
		}
		for _, want := range []string{":2: platform.base_url: http://", ":5: crawl.schedule:", ":6: crawl.concurrency:",
			"platform.registry_url: required", "platform.group: required", "platform.token: required"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("stderr does not say %q:\n%s", want, stderr)
			}
		}
		if stdout != "" {
			t.Errorf("stdout %q, want no verdicts before the config is valid", stdout)
		}
	})
}

func TestCheck_Help(t *testing.T) {
	code, _, stderr := runMain(context.Background(), "check", "--help")
	if code != exitOK || !strings.Contains(stderr, "Usage: syncd check") || !strings.Contains(stderr, "Example") {
		t.Fatalf("check --help: exit=%d, stderr=%q; want 0, usage and examples", code, stderr)
	}
}
