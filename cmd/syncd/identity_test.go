package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// identityConfig is a config with only what identity create needs: no
// registry_url, organization or NATS.
func identityConfig(t *testing.T, simURL string) string {
	return writeFile(
		t,
		"syncd.toml",
		fmt.Sprintf(
			"[platform]\nbase_url = %q\ntoken = %q\ngroup = \"org1\"\n\n[log]\nformat = \"json\"\n",
			simURL,
			e2eToken,
		),
	)
}

// simGet reads the simulator's API as an administrator would, independently
// of internal/platform.
func simGet(t *testing.T, simURL, path string, out any) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, simURL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+e2eToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusOK && out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
	}
	return resp.StatusCode
}

type simIdentity struct {
	UID, Name, Description string
	ClaimMatch             struct{ Issuer, Subject string }
}

// simIdentities lists every identity in the organization.
func simIdentities(t *testing.T, simURL string) []simIdentity {
	t.Helper()
	var page struct{ Identities []simIdentity }
	if code := simGet(
		t,
		simURL,
		"/iam/v2/identities?uidp.descendants_of=org1&page_size=200",
		&page,
	); code != http.StatusOK {
		t.Fatalf("list identities: HTTP %d", code)
	}
	return page.Identities
}

type simBinding struct {
	UID      string
	Identity struct{ UID, Name, Subject, Issuer string }
	Group    struct{ UID, Name string }
	Role     struct{ UID, Name string }
}

func simBindings(t *testing.T, simURL string) []simBinding {
	t.Helper()
	var page struct{ RoleBindings []simBinding }
	if code := simGet(
		t,
		simURL,
		"/iam/v2/roleBindings?uidp.descendants_of=org1&page_size=200",
		&page,
	); code != http.StatusOK {
		t.Fatalf("list role bindings: HTTP %d", code)
	}
	return page.RoleBindings
}

// writes counts the requests that could have changed the simulator.
func writes(st platformsim.Stats) int {
	n := 0
	for ep, c := range st.ByEndpoint {
		if !strings.HasPrefix(ep, "GET ") {
			n += c
		}
	}
	return n
}

const (
	ghIssuer  = "https://token.actions.githubusercontent.com"
	ghSubject = "repo:acme/mirror:ref:refs/heads/main"
)

func TestIdentityCreate(t *testing.T) {
	t.Run("CreatesIdentityAndHydratedBinding", func(t *testing.T) {
		_, simURL := startSim(t, 1, platformsim.Scale{})
		cfg := identityConfig(t, simURL)
		code, stdout, stderr := runMain(context.Background(), "identity", "create", "--config", cfg,
			"--name", "syncd prod", "--description", "the mirror", "--issuer", ghIssuer, "--subject", ghSubject)
		if code != exitOK {
			t.Fatalf("exit=%d, want 0; stderr: %s", code, stderr)
		}
		m := regexp.MustCompile(`(?m)^identity\s+(\S+)$`).FindStringSubmatch(stdout)
		if m == nil {
			t.Fatalf("stdout has no identity uid line:\n%s", stdout)
		}
		uid := m[1]

		var id simIdentity
		if code := simGet(t, simURL, "/iam/v2/identities/"+uid, &id); code != http.StatusOK {
			t.Fatalf("GET identity %s: HTTP %d", uid, code)
		}
		if id.Name != "syncd prod" || id.Description != "the mirror" || id.ClaimMatch.Issuer != ghIssuer ||
			id.ClaimMatch.Subject != ghSubject {
			t.Errorf("identity=%+v, want the flags' name, description, issuer and subject", id)
		}
		if got, want := strings.SplitN(uid, "/", 2)[0], "org1"; got != want || !strings.Contains(uid, "/") {
			t.Errorf("identity uid %q: want a child of the root group %s", uid, want)
		}
		bs := simBindings(t, simURL)
		if len(bs) != 1 {
			t.Fatalf("role bindings=%+v, want exactly one", bs)
		}
		b := bs[0]
		if b.Identity.UID != uid || b.Identity.Name != "syncd prod" || b.Identity.Issuer != ghIssuer ||
			b.Identity.Subject != ghSubject {
			t.Errorf("binding identity=%+v, want the new identity", b.Identity)
		}
		if b.Group.UID != "org1" || b.Group.Name != "acme" || b.Role.Name != "viewer" {
			t.Errorf("binding group=%+v role=%+v, want org1 (acme) and viewer", b.Group, b.Role)
		}
		// The printed binding is the platform's hydrated one.
		for _, want := range []string{
			b.UID,
			"syncd prod (" + uid + ")",
			"acme (org1)",
			"viewer (" + b.Role.UID + ")",
			`group = "org1"`,
			`identity = "` + uid + `"`,
			"identity_token_file = ",
		} {
			if !strings.Contains(stdout, want) {
				t.Errorf("stdout lacks %q:\n%s", want, stdout)
			}
		}
		if strings.Contains(stdout+stderr, e2eToken) {
			t.Error("the platform token appears in the output")
		}
	})

	t.Run("OtherRole", func(t *testing.T) {
		_, simURL := startSim(t, 1, platformsim.Scale{})
		code, _, stderr := runMain(context.Background(), "identity", "create", "--config", identityConfig(t, simURL),
			"--name", "syncd", "--issuer", ghIssuer, "--subject", ghSubject, "--role", "editor")
		if code != exitOK {
			t.Fatalf("exit=%d, want 0; stderr: %s", code, stderr)
		}
		if bs := simBindings(t, simURL); len(bs) != 1 || bs[0].Role.Name != "editor" {
			t.Fatalf("role bindings=%+v, want one with role editor", bs)
		}
	})

	t.Run("InvalidNameRejectedBeforeAnyRequest", func(t *testing.T) {
		sim, simURL := startSim(t, 1, platformsim.Scale{})
		code, _, stderr := runMain(context.Background(), "identity", "create", "--config", identityConfig(t, simURL),
			"--name", "Syncd/Prod", "--issuer", ghIssuer, "--subject", ghSubject)
		if code != exitUsage {
			t.Fatalf("exit=%d, want %d; stderr: %s", code, exitUsage, stderr)
		}
		if !strings.Contains(stderr, "--name") || !strings.Contains(stderr, "^[a-z0-9 ._-]{1,}$") {
			t.Errorf("stderr=%q, want it to name --name and the pattern", stderr)
		}
		if st := sim.Stats(); st.Total != 0 {
			t.Errorf("requests sent: %v, want none", st.ByEndpoint)
		}
	})

	t.Run("ServerBadRequestShowsFieldViolations", func(t *testing.T) {
		// The name passes the client's check; the simulator rejects an
		// issuer that is not an absolute URL with a BadRequest detail.
		sim, simURL := startSim(t, 1, platformsim.Scale{})
		code, _, stderr := runMain(context.Background(), "identity", "create", "--config", identityConfig(t, simURL),
			"--name", "syncd", "--issuer", "token.actions.githubusercontent.com", "--subject", ghSubject)
		if code != exitFailure {
			t.Fatalf("exit=%d, want %d; stderr: %s", code, exitFailure, stderr)
		}
		if !strings.Contains(stderr, "\n  claimMatch.issuer: must be an absolute URL") {
			t.Errorf("stderr=%q, want the field violation on its own line", stderr)
		}
		if got := sim.Stats().ByEndpoint["POST /iam/v2/identities/{parent}"]; got != 1 {
			t.Errorf("identity creates sent=%d, want 1 (the server, not the client, rejected it)", got)
		}
		if ids := simIdentities(t, simURL); len(ids) != 0 {
			t.Errorf("identities=%+v, want none", ids)
		}
	})

	t.Run("ServerNameViolationShownPerField", func(t *testing.T) {
		// The command never sends a name the pattern refuses, so this sends
		// one with the client directly: the spec's Error rule 1 answer comes
		// out as the field and its description, with the *platform.Error
		// still in the chain.
		_, simURL := startSim(t, 1, platformsim.Scale{})
		client, err := platform.New(
			platform.Config{BaseURL: simURL, RegistryURL: simURL, Token: platform.StaticToken(e2eToken)},
		)
		if err != nil {
			t.Fatal(err)
		}
		_, _, got := client.ProvisionIdentity(context.Background(), "org1", platform.Identity{Name: "Syncd/Prod"}, "viewer")
		if want := "the platform did not create the identity: the request was invalid (HTTP 400):\n" +
			"  name: must match ^[a-z0-9 ._-]{1,}$"; !strings.Contains(got.Error(), want) {
			t.Errorf("error=%q, want it to contain %q", got, want)
		}
		if !platform.IsInvalidArgument(got) {
			t.Errorf("error %v: the platform's InvalidArgument is lost from the chain", got)
		}
	})

	t.Run("UnknownRoleCreatesNothing", func(t *testing.T) {
		sim, simURL := startSim(t, 1, platformsim.Scale{})
		code, _, stderr := runMain(context.Background(), "identity", "create", "--config", identityConfig(t, simURL),
			"--name", "syncd", "--issuer", ghIssuer, "--subject", ghSubject, "--role", "reader")
		if code != exitFailure {
			t.Fatalf("exit=%d, want %d; stderr: %s", code, exitFailure, stderr)
		}
		_, exist, _ := strings.Cut(stderr, "roles that exist: ")
		if !strings.Contains(stderr, `--role "reader"`) || !strings.Contains(exist, "editor, ") ||
			!strings.Contains(exist, "viewer") {
			t.Errorf("stderr=%q, want the unknown role and the roles that exist, sorted", stderr)
		}
		if n := writes(sim.Stats()); n != 0 {
			t.Errorf("write requests=%d (%v), want none", n, sim.Stats().ByEndpoint)
		}
		if ids := simIdentities(t, simURL); len(ids) != 0 {
			t.Errorf("identities=%+v, want none", ids)
		}
	})

	t.Run("FailedBindingDeletesTheIdentity", func(t *testing.T) {
		sim, simURL := startSim(t, 1, platformsim.Scale{})
		sim.SetFaults(
			platformsim.Fault{
				Pattern:       "POST /iam/v2/roleBindings/{parent}",
				ErrorRate:     1,
				ErrorStatuses: []int{503},
				Remaining:     1,
			},
		)
		code, _, stderr := runMain(context.Background(), "identity", "create", "--config", identityConfig(t, simURL),
			"--name", "syncd", "--issuer", ghIssuer, "--subject", ghSubject)
		if code != exitFailure {
			t.Fatalf("exit=%d, want %d; stderr: %s", code, exitFailure, stderr)
		}
		st := sim.Stats()
		if st.ByEndpoint["POST /iam/v2/identities/{parent}"] != 1 || st.ByEndpoint["DELETE /iam/v2/identities/{uid}"] != 1 {
			t.Errorf("requests=%v, want one identity create and one delete", st.ByEndpoint)
		}
		if !strings.Contains(stderr, "deleted again") {
			t.Errorf("stderr=%q, want it to say the identity was deleted again", stderr)
		}
		if ids := simIdentities(t, simURL); len(ids) != 0 {
			t.Errorf("identities=%+v, want none left", ids)
		}
		if bs := simBindings(t, simURL); len(bs) != 0 {
			t.Errorf("role bindings=%+v, want none left", bs)
		}
	})

	t.Run("SubgroupRefused", func(t *testing.T) {
		sim, simURL := startSim(t, 1, platformsim.Scale{})
		code, _, stderr := runMain(context.Background(), "identity", "create", "--config", identityConfig(t, simURL),
			"--name", "syncd", "--issuer", ghIssuer, "--subject", ghSubject, "--group", "org1/team")
		if code != exitUsage || !strings.Contains(stderr, "cannot reach the organization's registry") ||
			!strings.Contains(stderr, "(org1)") {
			t.Fatalf("exit=%d stderr=%q, want 2 naming the root group org1", code, stderr)
		}
		if st := sim.Stats(); st.Total != 0 {
			t.Errorf("requests sent: %v, want none", st.ByEndpoint)
		}
	})

	t.Run("UsageErrors", func(t *testing.T) {
		for _, tc := range []struct {
			args []string
			want string
		}{
			{[]string{"identity"}, "missing action"},
			{[]string{"identity", "delete"}, `unknown action "delete"`},
			{[]string{"identity", "create", "--name", "syncd"}, "--issuer, --subject required"},
			{
				[]string{"identity", "create", "--name", "syncd", "--issuer", ghIssuer, "--subject", "s", "extra"},
				`unexpected argument "extra"`,
			},
		} {
			code, _, stderr := runMain(context.Background(), tc.args...)
			if code != exitUsage || !strings.Contains(stderr, tc.want) {
				t.Errorf("%v: exit=%d stderr=%q, want 2 and %q", tc.args, code, stderr, tc.want)
			}
		}
		// Without a token there is nothing to create with.
		p := writeFile(t, "syncd.toml", "[platform]\nbase_url = \"https://api.example.com\"\ngroup = \"org1\"\n")
		code, _, stderr := runMain(
			context.Background(),
			"identity",
			"create",
			"--config",
			p,
			"--name",
			"syncd",
			"--issuer",
			ghIssuer,
			"--subject",
			"s",
		)
		if code != exitUsage || !strings.Contains(stderr, "platform.token: required") {
			t.Errorf("no token: exit=%d stderr=%q, want 2 naming platform.token", code, stderr)
		}
	})
}
