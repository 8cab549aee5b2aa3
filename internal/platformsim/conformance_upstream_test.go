package platformsim_test

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platformsim"
)

// The conformance cases of the rules the vendor's own code shows
// (upstream-facts.md, "Corrections and additions from the vendor's own
// public code"): audiences, token exchange, hidden tag families, nested
// repos, withdrawn advisories, protojson, and faults aimed at one image.

const (
	registryToken = "test-registry-token"
	extSubject    = "system:serviceaccount:syncd:syncd"
)

func strict(o *platformsim.Options) {
	o.Strict = true
	o.RegistryTokens = []string{registryToken}
}

// send performs a prepared request and decodes the answer.
func (e *env) send(req *http.Request) resp {
	e.tb.Helper()
	hr, err := e.srv.Client().Do(req)
	if err != nil {
		e.tb.Fatalf("%s %s: %v", req.Method, req.URL.Path, err)
	}
	defer hr.Body.Close()
	raw, err := io.ReadAll(hr.Body)
	if err != nil {
		e.tb.Fatalf("read body: %v", err)
	}
	r := resp{status: hr.StatusCode, header: hr.Header, raw: raw}
	if len(raw) > 0 && strings.HasPrefix(hr.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(raw, &r.body); err != nil {
			e.tb.Fatalf("decode %q: %v", raw, err)
		}
	}
	return r
}

// registryErr returns the first OCI error of a registry answer.
func registryErr(t *testing.T, r resp) (code, message string) {
	t.Helper()
	errs, _ := r.body["errors"].([]any)
	if len(errs) == 0 {
		t.Fatalf("no OCI errors in %s", r.raw)
	}
	m := errs[0].(map[string]any)
	return str(m, "code"), str(m, "message")
}

// tokenScope asks /token for a per-image token with an Authorization value.
func (e *env) tokenScope(image, authz string) resp {
	req, _ := http.NewRequest(http.MethodGet, e.srv.URL+"/token?scope="+url.QueryEscape("repository:"+image+":pull"), nil)
	if authz != "" {
		req.Header.Set("Authorization", authz)
	}
	return e.send(req)
}

// assumable creates an identity under org1 whose claimMatch names the
// built-in external issuer and extSubject, adjusted by mod.
func (e *env) assumable(mod func(cm map[string]any)) string {
	e.tb.Helper()
	cm := map[string]any{"issuer": e.sim.ExternalIssuer(), "subject": extSubject}
	if mod != nil {
		mod(cm)
	}
	r := e.do(http.MethodPost, "/iam/v2/identities/org1", testToken, map[string]any{"name": "syncd", "claimMatch": cm})
	e.mustStatus(r, http.StatusOK)
	return str(r.body, "uid")
}

func (e *env) externalToken(subject, audience string, ttl time.Duration) string {
	e.tb.Helper()
	tok, err := e.sim.ExternalToken(subject, audience, ttl)
	if err != nil {
		e.tb.Fatal(err)
	}
	return tok
}

// exchange POSTs a form to /sts/exchange (or GETs it as a query) with the
// external token as bearer.
func (e *env) exchange(ext string, form url.Values, get bool) resp {
	e.tb.Helper()
	var req *http.Request
	if get {
		req, _ = http.NewRequest(http.MethodGet, e.sim.Issuer()+"/sts/exchange?"+form.Encode(), nil)
	} else {
		req, _ = http.NewRequest(http.MethodPost, e.sim.Issuer()+"/sts/exchange", strings.NewReader(form.Encode()))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	}
	if ext != "" {
		req.Header.Set("Authorization", "Bearer "+ext)
	}
	return e.send(req)
}

// forBoth is the exchange form asking for the API and registry audiences.
func (e *env) forBoth(identity string) url.Values {
	return url.Values{"aud": {e.sim.APIAudience(), e.sim.RegistryAudience()}, "identity": {identity}}
}

// privateTag is a tag of the org with the registry image it is read at.
func (e *env) privateTag(name string) (platformsim.TruthTag, string) {
	tg, _ := e.someTag(name)
	path, _ := e.sim.RegistryPath(tg.RepoUID)
	return tg, "acme/" + path
}

func TestAudienceRules(t *testing.T) {
	runCases(t, []testCase{
		{name: "Audience_PlatformTokenAtTokenEndpointForbidden", opts: strict, run: func(t *testing.T, e *env) {
			_, image := e.privateTag("")
			r := e.tokenScope(image, "Bearer "+testToken)
			e.mustStatus(r, http.StatusForbidden)
			if code, msg := registryErr(t, r); code != "DENIED" || !strings.Contains(msg, "is not the registry's audience") ||
				!strings.Contains(msg, e.sim.RegistryAudience()) {
				t.Fatalf("code=%s message=%q", code, msg)
			}
		}},
		{name: "Audience_PlatformTokenAtTokenEndpointLenientByDefault", run: func(t *testing.T, e *env) {
			_, image := e.privateTag("")
			e.mustStatus(e.tokenScope(image, "Bearer "+testToken), http.StatusOK)
		}},
		{name: "Audience_PlatformTokenAtHistoryForbidden", opts: strict, run: func(t *testing.T, e *env) {
			tg, image := e.privateTag("")
			r := e.history(image, tg.Name, testToken, "")
			e.mustStatus(r, http.StatusForbidden)
			if _, msg := registryErr(t, r); !strings.Contains(msg, "not the registry's audience") {
				t.Fatalf("message=%q", msg)
			}
		}},
		{name: "Audience_RegistryTokenAtAPIUnauthenticated", opts: strict, run: func(t *testing.T, e *env) {
			r := e.do(http.MethodGet, "/registry/v2/repos", registryToken, nil)
			e.mustStatus(r, http.StatusUnauthorized)
			if r.body["code"] != float64(16) || !strings.Contains(str(r.body, "message"), "audience") {
				t.Fatalf("body=%s", r.raw)
			}
		}},
		{name: "Audience_RegistryTokenAtHistoryDirectly", opts: strict, run: func(t *testing.T, e *env) {
			tg, image := e.privateTag("")
			r := e.history(image, tg.Name, registryToken, "")
			e.mustStatus(r, http.StatusOK)
			want, _ := e.sim.History(tg.UID)
			if h := historyOf(r); len(h) != len(want) || str(h[len(h)-1], "digest") != tg.Digest {
				t.Fatalf("history=%s", r.raw)
			}
		}},
		{name: "Audience_RegistryTokenAsBasicTokenUserAtTokenEndpoint", opts: strict, run: func(t *testing.T, e *env) {
			tg, image := e.privateTag("")
			basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("_token:"+registryToken))
			r := e.tokenScope(image, basic)
			e.mustStatus(r, http.StatusOK)
			e.mustStatus(e.history(image, tg.Name, str(r.body, "token"), ""), http.StatusOK)
		}},
		{name: "Audience_RegistryTokenAsBearerAtTokenEndpoint", opts: strict, run: func(t *testing.T, e *env) {
			tg, image := e.privateTag("")
			r := e.tokenScope(image, "Bearer "+registryToken)
			e.mustStatus(r, http.StatusOK)
			e.mustStatus(e.history(image, tg.Name, str(r.body, "token"), ""), http.StatusOK)
		}},
		{name: "Audience_MintedRegistryToken", opts: strict, run: func(t *testing.T, e *env) {
			tg, image := e.privateTag("")
			r := e.do(http.MethodPost, "/_sim/tokens", "", map[string]any{"audience": "registry"})
			e.mustStatus(r, http.StatusOK)
			tok := str(r.body, "token")
			e.mustStatus(e.history(image, tg.Name, tok, ""), http.StatusOK)
			e.mustStatus(e.do(http.MethodGet, "/ping/v2/ping", tok, nil), http.StatusUnauthorized)
			// A subgroup identity's registry token does not reach the org.
			sub := e.do(http.MethodPost, "/iam/v2/groups/org1", testToken, map[string]any{"name": "team"})
			id := e.do(
				http.MethodPost,
				"/iam/v2/identities/"+str(sub.body, "uid"),
				testToken,
				map[string]any{"name": "team bot"},
			)
			subTok, err := e.sim.MintTokenFor(str(id.body, "uid"), platformsim.AudienceRegistry)
			if err != nil {
				t.Fatal(err)
			}
			e.mustStatus(e.history(image, tg.Name, subTok, ""), http.StatusForbidden)
		}},
		{name: "Audience_AnonymousPublicStillWorks", opts: strict, run: func(t *testing.T, e *env) {
			pub := e.sim.Truth().PublicTags[0]
			tok := e.registryToken("chainguard/"+pub.Image, "")
			e.mustStatus(e.history("chainguard/"+pub.Image, "latest", tok, ""), http.StatusOK)
		}},
	})
}

// foreignToken signs claims naming the external issuer with a key that is
// not the issuer's.
func foreignToken(t *testing.T, e *env) string {
	t.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		t.Fatal(err)
	}
	enc := base64.RawURLEncoding
	h, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": "foreign"})
	now := e.sim.Now()
	p, _ := json.Marshal(map[string]any{"iss": e.sim.ExternalIssuer(), "sub": extSubject, "aud": "127.0.0.1",
		"iat": now.Unix(), "exp": now.Add(time.Hour).Unix()})
	signing := enc.EncodeToString(h) + "." + enc.EncodeToString(p)
	sum := sha256.Sum256([]byte(signing))
	sig, err := rsa.SignPKCS1v15(nil, key, crypto.SHA256, sum[:])
	if err != nil {
		t.Fatal(err)
	}
	return signing + "." + enc.EncodeToString(sig)
}

func TestExchangeRules(t *testing.T) {
	// refused checks an exchange refusal: its status, that the message
	// names what failed, and that the token is not echoed.
	refused := func(t *testing.T, e *env, ext string, form url.Values, status int, says string) {
		t.Helper()
		r := e.exchange(ext, form, false)
		e.mustStatus(r, status)
		if msg := str(r.body, "message"); !strings.Contains(msg, says) {
			t.Fatalf("message=%q, want it to say %q", msg, says)
		}
		if ext != "" && strings.Contains(string(r.raw), ext) {
			t.Fatal("the refusal echoes the external token")
		}
	}
	runCases(t, []testCase{
		{name: "Exchange_PostFormBothAudiences", opts: strict, run: func(t *testing.T, e *env) {
			id := e.assumable(nil)
			r := e.exchange(e.externalToken(extSubject, "", 0), e.forBoth(id), false)
			e.mustStatus(r, http.StatusOK)
			tok := str(r.body, "token")
			if tok == "" || str(r.body, "refreshToken") == "" {
				t.Fatalf("answer=%s", r.raw)
			}
			expiry, err := time.Parse(time.RFC3339, str(r.body, "expiry"))
			if err != nil || expiry.Sub(e.sim.Now()) > time.Hour || expiry.Sub(e.sim.Now()) < 59*time.Minute {
				t.Fatalf("expiry=%q (%v), want about an hour of simulator time", str(r.body, "expiry"), err)
			}
			e.mustStatus(e.do(http.MethodGet, "/registry/v2/repos", tok, nil), http.StatusOK)
			tg, image := e.privateTag("")
			e.mustStatus(e.history(image, tg.Name, tok, ""), http.StatusOK)
			if got := e.sim.Stats().Exchanges; got != 1 {
				t.Fatalf("exchanges=%d, want 1", got)
			}
		}},
		{name: "Exchange_GetQueryOneAudience", opts: strict, run: func(t *testing.T, e *env) {
			id := e.assumable(nil)
			form := url.Values{"aud": {e.sim.APIAudience()}, "identity": {id}}
			r := e.exchange(e.externalToken(extSubject, "", 0), form, true)
			e.mustStatus(r, http.StatusOK)
			tok := str(r.body, "token")
			e.mustStatus(e.do(http.MethodGet, "/registry/v2/repos", tok, nil), http.StatusOK)
			tg, image := e.privateTag("")
			e.mustStatus(e.history(image, tg.Name, tok, ""), http.StatusForbidden)
			e.mustStatus(e.tokenScope(image, "Bearer "+tok), http.StatusForbidden)
		}},
		{name: "Exchange_RegistryAudienceOnly", opts: strict, run: func(t *testing.T, e *env) {
			id := e.assumable(nil)
			form := url.Values{"aud": {e.sim.RegistryAudience()}, "identity": {id}}
			tok := str(e.exchange(e.externalToken(extSubject, "", 0), form, false).body, "token")
			e.mustStatus(e.do(http.MethodGet, "/registry/v2/repos", tok, nil), http.StatusUnauthorized)
			_, image := e.privateTag("")
			basic := "Basic " + base64.StdEncoding.EncodeToString([]byte("_token:"+tok))
			e.mustStatus(e.tokenScope(image, basic), http.StatusOK)
		}},
		{name: "Exchange_ClaimMatchAudience", run: func(t *testing.T, e *env) {
			id := e.assumable(func(cm map[string]any) { cm["audience"] = "sts.example" })
			form := e.forBoth(id)
			e.mustStatus(e.exchange(e.externalToken(extSubject, "sts.example", 0), form, false), http.StatusOK)
			refused(t, e, e.externalToken(extSubject, "", 0), form, http.StatusForbidden, `does not include "sts.example"`)
		}},
		{name: "Exchange_RefusedWithoutBearer", run: func(t *testing.T, e *env) {
			refused(t, e, "", e.forBoth(e.assumable(nil)), http.StatusUnauthorized, "external OIDC token")
		}},
		{name: "Exchange_RefusedWithoutIdentityOrAudience", run: func(t *testing.T, e *env) {
			ext := e.externalToken(extSubject, "", 0)
			r := e.exchange(ext, url.Values{"aud": {e.sim.APIAudience()}}, false)
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "identity")
			r = e.exchange(ext, url.Values{"identity": {e.assumable(nil)}}, false)
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "aud")
			r = e.exchange(ext, url.Values{"identity": {e.assumable(nil)}, "aud": {"https://elsewhere.example"}}, false)
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "aud")
		}},
		{name: "Exchange_RefusedUnknownIdentity", run: func(t *testing.T, e *env) {
			refused(
				t,
				e,
				e.externalToken(extSubject, "", 0),
				e.forBoth("org1/0000000000000000"),
				http.StatusNotFound,
				"org1/0000000000000000",
			)
		}},
		{name: "Exchange_RefusedWrongSubject", run: func(t *testing.T, e *env) {
			refused(t, e, e.externalToken("system:serviceaccount:other:other", "", 0), e.forBoth(e.assumable(nil)),
				http.StatusForbidden, `subject "system:serviceaccount:other:other" does not match`)
		}},
		{name: "Exchange_RefusedWrongIssuer", run: func(t *testing.T, e *env) {
			id := e.assumable(func(cm map[string]any) { cm["issuer"] = "https://token.actions.githubusercontent.com" })
			refused(
				t,
				e,
				e.externalToken(extSubject, "", 0),
				e.forBoth(id),
				http.StatusForbidden,
				"does not match the claimMatch issuer",
			)
		}},
		{name: "Exchange_RefusedBadSignature", run: func(t *testing.T, e *env) {
			refused(t, e, foreignToken(t, e), e.forBoth(e.assumable(nil)), http.StatusUnauthorized, "signature does not verify")
		}},
		{name: "Exchange_RefusedUnreachableIssuer", run: func(t *testing.T, e *env) {
			// The issuer is only as good as its discovery document.
			id := e.assumable(func(cm map[string]any) { cm["issuer"] = e.srv.URL + "/no-such-issuer" })
			parts := strings.Split(e.externalToken(extSubject, "", 0), ".")
			payload, _ := base64.RawURLEncoding.DecodeString(parts[1])
			payload = []byte(strings.Replace(string(payload), e.sim.ExternalIssuer(), e.srv.URL+"/no-such-issuer", 1))
			tok := parts[0] + "." + base64.RawURLEncoding.EncodeToString(payload) + "." + parts[2]
			refused(t, e, tok, e.forBoth(id), http.StatusUnauthorized, "cannot discover issuer")
		}},
		{name: "Exchange_RefusedExpiredExternalToken", run: func(t *testing.T, e *env) {
			ext := e.externalToken(extSubject, "", time.Minute)
			e.sim.Advance(2 * time.Minute)
			refused(t, e, ext, e.forBoth(e.assumable(nil)), http.StatusUnauthorized, "expired")
		}},
		{name: "Exchange_RefusedWrongAudience", run: func(t *testing.T, e *env) {
			refused(t, e, e.externalToken(extSubject, "kubernetes.default.svc", 0), e.forBoth(e.assumable(nil)),
				http.StatusForbidden, `does not include "127.0.0.1"`)
		}},
		{name: "Exchange_TokensExpireInSimulatorTime", opts: func(o *platformsim.Options) {
			strict(o)
			o.ExchangeTokenTTL = 10 * time.Minute
		}, run: func(t *testing.T, e *env) {
			tok := str(e.exchange(e.externalToken(extSubject, "", 0), e.forBoth(e.assumable(nil)), false).body, "token")
			tg, image := e.privateTag("")
			perImage := str(e.tokenScope(image, "Bearer "+tok).body, "token")
			e.sim.Advance(9 * time.Minute)
			e.mustStatus(e.do(http.MethodGet, "/ping/v2/ping", tok, nil), http.StatusOK)
			e.sim.Advance(2 * time.Minute)
			r := e.do(http.MethodGet, "/ping/v2/ping", tok, nil)
			e.mustStatus(r, http.StatusUnauthorized)
			if !strings.Contains(str(r.body, "message"), "expired") {
				t.Fatalf("message=%q", str(r.body, "message"))
			}
			e.mustStatus(e.history(image, tg.Name, tok, ""), http.StatusUnauthorized)
			// A per-image token does not outlive its credential.
			e.mustStatus(e.history(image, tg.Name, perImage, ""), http.StatusUnauthorized)
		}},
		{name: "Exchange_ControlAPIExternalToken", run: func(t *testing.T, e *env) {
			r := e.do(http.MethodPost, "/_sim/external-token", "", map[string]any{"subject": extSubject, "ttl": "5m"})
			e.mustStatus(r, http.StatusOK)
			disc := e.do(
				http.MethodGet,
				strings.TrimPrefix(e.sim.ExternalIssuer(), e.srv.URL)+"/.well-known/openid-configuration",
				"",
				nil,
			)
			if str(disc.body, "issuer") != e.sim.ExternalIssuer() {
				t.Fatalf("discovery=%s", disc.raw)
			}
			e.mustStatus(e.exchange(str(r.body, "token"), e.forBoth(e.assumable(nil)), false), http.StatusOK)
		}},
	})
}

// familyScale has two tags of each hidden family per repo.
func familyScale() *platformsim.Scale {
	sc := smallScale()
	sc.DateTags, sc.EpochTags, sc.ReferrerTags = 2, 2, 2
	return &sc
}

func TestTagFamilyRules(t *testing.T) {
	// listed counts a repo's listed tags by family.
	listed := func(e *env, repo, extra string) map[string]int {
		q, _ := url.ParseQuery(extra)
		q.Set("uidp.children_of", repo)
		out := map[string]int{}
		for _, tg := range e.listAll("/registry/v2/tags", q, "tags") {
			out[platformsim.TagFamily(str(tg, "name"))]++
		}
		return out
	}
	per := smallScale().TagsPerRepo
	runCases(t, []testCase{
		{name: "Families_HiddenUnlessAsked", scale: familyScale(), opts: strict, run: func(t *testing.T, e *env) {
			repo := e.sim.Truth().Repos[0].UID
			for _, c := range []struct {
				query string
				want  map[string]int
			}{
				{"", map[string]int{"": per}},
				{"include_dates=true", map[string]int{"": per, "dates": 2}},
				{"includeEpochs=true", map[string]int{"": per, "epochs": 2}},
				{"include_referrers=1", map[string]int{"": per, "referrers": 2}},
				{
					"include_dates=true&include_epochs=true&includeReferrers=true",
					map[string]int{"": per, "dates": 2, "epochs": 2, "referrers": 2},
				},
			} {
				if got := listed(e, repo, c.query); !mapsEqual(got, c.want) {
					t.Fatalf("%q listed %v, want %v", c.query, got, c.want)
				}
			}
			r := e.get("/registry/v2/tags?include_dates=maybe")
			e.mustStatus(r, http.StatusBadRequest)
			assertBadRequest(t, r, "include_dates")
		}},
		{name: "Families_ShownWithoutStrict", scale: familyScale(), run: func(t *testing.T, e *env) {
			got := listed(e, e.sim.Truth().Repos[0].UID, "")
			if want := (map[string]int{"": per, "dates": 2, "epochs": 2, "referrers": 2}); !mapsEqual(got, want) {
				t.Fatalf("listed %v, want %v", got, want)
			}
		}},
		{name: "Families_GeneratedWithHistory", scale: familyScale(), run: func(t *testing.T, e *env) {
			truth := e.sim.Truth()
			count := map[string]int{}
			for _, tg := range truth.Tags {
				count[tg.Family]++
				if len(truth.History[tg.UID]) != smallScale().HistoryPerTag {
					t.Fatalf("tag %s has %d records", tg.Name, len(truth.History[tg.UID]))
				}
			}
			n := smallScale().Repos
			if want := (map[string]int{"": n * per, "dates": 2 * n, "epochs": 2 * n, "referrers": 2 * n}); !mapsEqual(
				count,
				want,
			) {
				t.Fatalf("families=%v, want %v", count, want)
			}
		}},
		{name: "Families_GetByUIDAndPushStillWork", scale: familyScale(), opts: func(o *platformsim.Options) {
			strict(o)
			fastDelivery(o)
		}, run: func(t *testing.T, e *env) {
			var date platformsim.TruthTag
			for _, tg := range e.sim.Truth().Tags {
				if tg.Family == platformsim.FamilyDates {
					date = tg
				}
			}
			r := e.get("/registry/v2/tags/" + date.UID)
			e.mustStatus(r, http.StatusOK)
			if str(r.body, "name") != date.Name {
				t.Fatalf("get=%s", r.raw)
			}
			if body := pushAfterMove(t, e, date.UID); str(body, "tag") != date.Name {
				t.Fatalf("push body=%v, want tag %s", body, date.Name)
			}
		}},
		{name: "Families_ScenarioMovesThem", scale: familyScale(), run: func(t *testing.T, e *env) {
			e.sim.SetRates(platformsim.Rates{MoveTag: 1})
			family := map[string]string{}
			for _, tg := range e.sim.Truth().Tags {
				family[tg.UID] = tg.Family
			}
			moved := map[string]bool{}
			for _, m := range e.sim.Step(100) {
				moved[family[m.UID]] = true
			}
			for _, f := range []string{"", platformsim.FamilyDates, platformsim.FamilyEpochs, platformsim.FamilyReferrers} {
				if !moved[f] {
					t.Fatalf("100 moves never moved a tag of family %q", f)
				}
			}
		}},
		{name: "TagList_UpdatedSinceExclusiveInStrict", opts: strict, run: func(t *testing.T, e *env) {
			tg, _ := e.someTag("latest")
			e.sim.Advance(time.Hour)
			at := e.sim.Now().UTC()
			if err := e.sim.MoveTag(tg.UID, "sha256:"+strings.Repeat("5e", 32)); err != nil {
				t.Fatal(err)
			}
			got := items(e.get("/registry/v2/tags?updated_since="+url.QueryEscape(at.Format(time.RFC3339Nano))), "tags")
			if len(got) != 0 {
				t.Fatalf("updated_since=<move time> kept %d tags, want none (after, not at)", len(got))
			}
			got = items(
				e.get("/registry/v2/tags?updatedSince="+url.QueryEscape(at.Add(-time.Millisecond).Format(time.RFC3339Nano))),
				"tags",
			)
			if len(got) != 1 || str(got[0], "uid") != tg.UID {
				t.Fatalf("updated_since=<just before> gave %d tags, want the moved one", len(got))
			}
		}},
		{name: "TagList_DigestFilterRespectsFamilies", scale: familyScale(), opts: strict, run: func(t *testing.T, e *env) {
			var epoch platformsim.TruthTag
			for _, tg := range e.sim.Truth().Tags {
				if tg.Family == platformsim.FamilyEpochs {
					epoch = tg
				}
			}
			q := "/registry/v2/tags?digest=" + url.QueryEscape(epoch.Digest)
			if got := items(e.get(q), "tags"); len(got) != 0 {
				t.Fatalf("digest of a hidden tag listed %d tags without include_epochs", len(got))
			}
			if got := items(e.get(q+"&include_epochs=true"), "tags"); len(got) != 1 || str(got[0], "uid") != epoch.UID {
				t.Fatalf("digest filter gave %v", got)
			}
		}},
	})
}

// pushAfterMove subscribes a sink, moves a tag and returns the body of the
// push event the sink receives.
func pushAfterMove(t *testing.T, e *env, tagUID string) map[string]any {
	t.Helper()
	sink, u := newSink(t, 0)
	subscribe(t, e, u)
	if err := e.sim.MoveTag(tagUID, "sha256:"+strings.Repeat("d0", 32)); err != nil {
		t.Fatal(err)
	}
	_, bodies := sink.waitFor(t, 2) // subscription.created, then the push
	var ev struct {
		Body map[string]any `json:"body"`
	}
	if err := json.Unmarshal(bodies[1], &ev); err != nil {
		t.Fatal(err)
	}
	return ev.Body
}

func mapsEqual(a, b map[string]int) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

// nestedScale puts four repos below subgroups, two of them two levels down.
func nestedScale() *platformsim.Scale {
	sc := smallScale()
	sc.NestedRepos = 4
	return &sc
}

// nestedRepo returns a repo of the given depth below the root group.
func nestedRepo(t *testing.T, e *env, depth int) platformsim.TruthRepo {
	t.Helper()
	for _, r := range e.sim.Truth().Repos {
		if strings.Count(r.Path, "/") == depth {
			return r
		}
	}
	t.Fatalf("no repo at depth %d", depth)
	return platformsim.TruthRepo{}
}

func TestNestedRepoRules(t *testing.T) {
	tagOf := func(e *env, repo string) platformsim.TruthTag {
		for _, tg := range e.sim.Truth().Tags {
			if tg.RepoUID == repo {
				return tg
			}
		}
		return platformsim.TruthTag{}
	}
	runCases(t, []testCase{
		{name: "Nested_PathIsTheChainOfNames", scale: nestedScale(), run: func(t *testing.T, e *env) {
			truth := e.sim.Truth()
			names := map[string]string{}
			for _, g := range truth.Groups {
				names[g.UID] = g.Name
			}
			depths := map[int]int{}
			for _, r := range truth.Repos {
				segs := strings.Split(r.UID, "/")[1:]
				var want []string
				for i := range segs[:len(segs)-1] {
					want = append(want, names[strings.Join(strings.Split(r.UID, "/")[:i+2], "/")])
				}
				want = append(want, r.Name)
				if r.Path != strings.Join(want, "/") {
					t.Fatalf("repo %s path=%q, want %q", r.UID, r.Path, strings.Join(want, "/"))
				}
				depths[len(segs)-1]++
			}
			if depths[1] != 2 || depths[2] != 2 || depths[0] != smallScale().Repos-4 {
				t.Fatalf("repos by depth=%v", depths)
			}
			if p := nestedRepo(t, e, 1).Path; !strings.HasPrefix(p, "charts/") && !strings.HasPrefix(p, "tools/") {
				t.Fatalf("one level down: %q", p)
			}
		}},
		{name: "Nested_SubgroupsListedAndGettable", scale: nestedScale(), run: func(t *testing.T, e *env) {
			groups := e.listAll("/iam/v2/groups", url.Values{"uidp.descendants_of": {"org1"}}, "groups")
			byName := map[string]string{}
			for _, g := range groups {
				byName[str(g, "name")] = str(g, "uid")
			}
			if byName["charts"] == "" || byName["stable"] == "" || !strings.HasPrefix(byName["stable"], byName["charts"]+"/") &&
				!strings.HasPrefix(byName["stable"], byName["tools"]+"/") {
				t.Fatalf("subgroups=%v", byName)
			}
			e.mustStatus(e.get("/iam/v2/groups/"+byName["stable"]), http.StatusOK)
			all := e.listAll("/registry/v2/repos", url.Values{"uidp.descendants_of": {"org1"}}, "repos")
			top := e.listAll("/registry/v2/repos", url.Values{"uidp.children_of": {"org1"}}, "repos")
			if len(all) != smallScale().Repos || len(top) != smallScale().Repos-4 {
				t.Fatalf("descendants=%d children=%d", len(all), len(top))
			}
		}},
		{name: "Nested_HistoryAtPathNotAtName", scale: nestedScale(), opts: strict, run: func(t *testing.T, e *env) {
			rp := nestedRepo(t, e, 2)
			tg := tagOf(e, rp.UID)
			r := e.tokenScope("acme/"+rp.Path, "Bearer "+registryToken)
			e.mustStatus(r, http.StatusOK)
			perImage := str(r.body, "token")
			h := e.history("acme/"+rp.Path, tg.Name, perImage, "")
			e.mustStatus(h, http.StatusOK)
			if got := historyOf(h); str(got[len(got)-1], "digest") != tg.Digest {
				t.Fatalf("history=%s", h.raw)
			}
			e.mustStatus(e.history("acme/"+rp.Path, tg.Name, registryToken, ""), http.StatusOK)
			flat := e.history("acme/"+rp.Name, tg.Name, registryToken, "")
			e.mustStatus(flat, http.StatusNotFound)
			if code, _ := registryErr(t, flat); code != "NAME_UNKNOWN" {
				t.Fatalf("flat path answered %s", code)
			}
			missing := e.history("acme/"+rp.Path, "no-such-tag", registryToken, "")
			if code, _ := registryErr(t, missing); missing.status != 404 || code != "MANIFEST_UNKNOWN" {
				t.Fatalf("missing tag answered %d %s", missing.status, code)
			}
		}},
		{name: "Nested_RenamingAGroupMovesThePath", scale: nestedScale(), opts: strict, run: func(t *testing.T, e *env) {
			rp := nestedRepo(t, e, 1)
			tg := tagOf(e, rp.UID)
			group := rp.UID[:strings.LastIndexByte(rp.UID, '/')]
			e.mustStatus(
				e.do(http.MethodPatch, "/iam/v2/groups/"+group, testToken, map[string]any{"name": "helm"}),
				http.StatusOK,
			)
			path, _ := e.sim.RegistryPath(rp.UID)
			if want := "helm/" + rp.Name; path != want {
				t.Fatalf("path=%q, want %q", path, want)
			}
			e.mustStatus(e.history("acme/"+rp.Path, tg.Name, registryToken, ""), http.StatusNotFound)
			e.mustStatus(e.history("acme/"+path, tg.Name, registryToken, ""), http.StatusOK)
		}},
		{name: "Nested_PushNamesThePath", scale: nestedScale(), opts: fastDelivery, run: func(t *testing.T, e *env) {
			rp := nestedRepo(t, e, 2)
			if body := pushAfterMove(t, e, tagOf(e, rp.UID).UID); str(body, "repository") != rp.Path {
				t.Fatalf("push body=%v, want repository %q", body, rp.Path)
			}
		}},
		{name: "Nested_PushRepositoryUIDOption", scale: nestedScale(), opts: func(o *platformsim.Options) {
			fastDelivery(o)
			o.PushRepositoryUID, o.CivilPushTime = true, true
		}, run: func(t *testing.T, e *env) {
			rp := nestedRepo(t, e, 1)
			body := pushAfterMove(t, e, tagOf(e, rp.UID).UID)
			if str(body, "repository") != rp.UID {
				t.Fatalf("push body=%v, want the uid as repository", body)
			}
			if _, err := time.Parse("2006-01-02T15:04:05.000", str(body, "when")); err != nil {
				t.Fatalf("when is not a civil time: %v", err)
			}
		}},
	})
}

func TestAdvisoryWithdrawal(t *testing.T) {
	runCases(t, []testCase{
		{name: "Advisory_WithdrawnStaysListedWithDeleteTime", run: func(t *testing.T, e *env) {
			a := e.sim.Truth().Advisories[0]
			e.sim.Advance(time.Hour)
			m, err := e.sim.Apply(platformsim.Mutation{Kind: platformsim.AdvisoryWithdrawn, UID: a.UID})
			if err != nil {
				t.Fatal(err)
			}
			r := e.get("/vulnerabilities/v2/advisories/" + a.UID)
			e.mustStatus(r, http.StatusOK)
			if got := str(r.body, "deleteTime"); got != m.Time.Format("2006-01-02T15:04:05.000Z") {
				t.Fatalf("deleteTime=%q, want %v", got, m.Time)
			}
			all := e.listAll("/vulnerabilities/v2/advisories", url.Values{}, "advisories")
			withdrawn := 0
			for _, x := range all {
				if _, ok := x["deleteTime"]; ok {
					withdrawn++
				}
			}
			if len(all) != smallScale().Advisories || withdrawn != 1 {
				t.Fatalf("listed %d advisories, %d withdrawn", len(all), withdrawn)
			}
			for _, x := range e.sim.Truth().Advisories {
				if (x.UID == a.UID) != (x.DeleteTime != nil) {
					t.Fatalf("truth deleteTime of %s = %v", x.UID, x.DeleteTime)
				}
			}
			if _, err := e.sim.Apply(platformsim.Mutation{Kind: platformsim.AdvisoryWithdrawn, UID: a.UID}); err == nil {
				t.Fatal("withdrew an advisory twice")
			}
		}},
		{name: "Advisory_WithdrawAndDeleteThroughControlAPI", run: func(t *testing.T, e *env) {
			advs := e.sim.Truth().Advisories
			e.mustStatus(
				e.do(http.MethodPost, "/_sim/mutations", "", map[string]any{"kind": "advisory.withdrawn", "uid": advs[0].UID}),
				http.StatusOK,
			)
			e.mustStatus(
				e.do(http.MethodPost, "/_sim/mutations", "", map[string]any{"kind": "advisory.deleted", "uid": advs[1].UID}),
				http.StatusOK,
			)
			e.mustStatus(e.get("/vulnerabilities/v2/advisories/"+advs[1].UID), http.StatusNotFound)
			if got := len(e.sim.Truth().Advisories); got != len(advs)-1 {
				t.Fatalf("advisories=%d after a deletion, want %d", got, len(advs)-1)
			}
		}},
		{name: "Advisory_ScenarioWithdraws", run: func(t *testing.T, e *env) {
			e.sim.SetRates(platformsim.Rates{WithdrawAdvisory: 1, DeleteAdvisory: 1})
			kinds := map[platformsim.MutationKind]int{}
			for _, m := range e.sim.Step(10) {
				kinds[m.Kind]++
			}
			if kinds[platformsim.AdvisoryWithdrawn] == 0 || kinds[platformsim.AdvisoryDeleted] == 0 {
				t.Fatalf("kinds=%v", kinds)
			}
		}},
	})
}

var fractionRE = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.(\d{3}|\d{6}|\d{9}))?Z$`)

func TestProtoJSON(t *testing.T) {
	runCases(t, []testCase{
		{name: "ProtoJSON_ZeroValuesOmitted", opts: strict, run: func(t *testing.T, e *env) {
			r := e.do(http.MethodPost, "/registry/v2/repos/org1", testToken, map[string]any{"name": "bare"})
			e.mustStatus(r, http.StatusOK)
			for _, k := range []string{"description", "aliases", "bundles", "activeTags", "catalogTier"} {
				if _, ok := r.body[k]; ok {
					t.Fatalf("zero field %s present: %s", k, r.raw)
				}
			}
			tg, _ := e.someTag("latest")
			got := e.get("/registry/v2/tags/" + tg.UID)
			if _, ok := got.body["deprecated"]; ok {
				t.Fatalf("deprecated=false present: %s", got.raw)
			}
			if _, ok := got.body["createTime"]; ok {
				t.Fatalf("a tag has no createTime upstream: %s", got.raw)
			}
			list := e.get("/registry/v2/repos?page_size=2")
			if _, ok := list.body["skipped"]; ok {
				t.Fatalf("skipped=0 present: %s", list.raw)
			}
			if _, ok := list.body["totalCount"].(string); !ok {
				t.Fatalf("totalCount is not a string: %s", list.raw)
			}
			sub := e.do(
				http.MethodPost,
				"/events/v2/subscriptions/org1",
				testToken,
				map[string]any{"sink": "https://hooks.example/x"},
			)
			if _, ok := sub.body["createTime"]; ok || str(sub.body, "sink") == "" {
				t.Fatalf("subscription=%s, want {uid, sink}", sub.raw)
			}
		}},
		{name: "ProtoJSON_EnumsInFull", opts: strict, run: func(t *testing.T, e *env) {
			for _, rp := range items(e.get("/registry/v2/repos"), "repos") {
				if tier := str(rp, "catalogTier"); tier != "" && !strings.HasPrefix(tier, "CATALOG_TIER_") {
					t.Fatalf("catalogTier=%q", tier)
				}
			}
		}},
		{name: "ProtoJSON_TimestampFractionsValuesEqual", opts: strict, run: func(t *testing.T, e *env) {
			truth := map[string]time.Time{}
			for _, rp := range e.sim.Truth().Repos {
				truth[rp.UID] = rp.UpdateTime
			}
			digits := map[int]bool{}
			for _, rp := range e.listAll("/registry/v2/repos", url.Values{}, "repos") {
				v := str(rp, "updateTime")
				if !fractionRE.MatchString(v) {
					t.Fatalf("updateTime %q", v)
				}
				if at, err := time.Parse(time.RFC3339Nano, v); err != nil || !at.Equal(truth[str(rp, "uid")]) {
					t.Fatalf("updateTime %q is not %v", v, truth[str(rp, "uid")])
				}
				_, frac, _ := strings.Cut(strings.TrimSuffix(v, "Z"), ".")
				digits[len(frac)] = true
			}
			if len(digits) < 2 {
				t.Fatalf("fraction lengths %v: want a mix", digits)
			}
			// A whole second has no fraction, as protojson writes it.
			tg, _ := e.someTag("latest")
			e.sim.Advance(time.Hour)
			_ = e.sim.MoveTag(tg.UID, "sha256:"+strings.Repeat("0f", 32))
			first := e.get("/registry/v2/tags/" + tg.UID)
			if v := str(first.body, "updateTime"); strings.Contains(v, ".") {
				t.Fatalf("whole-second updateTime %q", v)
			}
			if again := e.get("/registry/v2/tags/" + tg.UID); string(again.raw) != string(first.raw) {
				t.Fatal("the same resource rendered differently twice")
			}
		}},
		{name: "ProtoJSON_UnknownFieldsAdded", opts: strict, run: func(t *testing.T, e *env) {
			list := e.get("/registry/v2/repos?page_size=200")
			if list.body[platformsim.FutureField] == nil {
				t.Fatalf("envelope lacks %s", platformsim.FutureField)
			}
			seen := map[string]bool{}
			for _, rp := range items(list, "repos") {
				for _, k := range []string{platformsim.FutureField, "sync_config", "customOverlay"} {
					if rp[k] != nil {
						seen[k] = true
					}
				}
			}
			if len(seen) != 3 {
				t.Fatalf("unknown fields seen on repos: %v", seen)
			}
			tg, image := e.privateTag("")
			h := e.history(image, tg.Name, registryToken, "")
			recs := historyOf(h)
			if h.body[platformsim.FutureField] == nil || recs[0][platformsim.FutureField] == nil {
				t.Fatalf("history lacks unknown fields: %s", h.raw)
			}
			for _, rec := range recs {
				if !fractionRE.MatchString(str(rec, "updateTimestamp")) {
					t.Fatalf("updateTimestamp %q", str(rec, "updateTimestamp"))
				}
			}
		}},
	})
}

func TestImageFaults(t *testing.T) {
	runCases(t, []testCase{
		{
			name:  "Fault_ImageHistoryAnswers404Then403ThenRecovers",
			scale: nestedScale(),
			opts:  strict,
			run: func(t *testing.T, e *env) {
				gone, denied := nestedRepo(t, e, 2), nestedRepo(t, e, 0)
				e.sim.AddFaults(
					platformsim.Fault{Name: "gone", Image: "acme/" + gone.Path, Status: http.StatusNotFound},
					platformsim.Fault{
						Name:   "denied",
						Path:   "/v2/acme/" + denied.Path + "/_chainguard/history/*",
						Status: http.StatusForbidden,
					},
				)
				tags := map[string]string{}
				for _, tg := range e.sim.Truth().Tags {
					tags[tg.RepoUID] = tg.Name
				}
				r := e.history("acme/"+gone.Path, tags[gone.UID], registryToken, "")
				if code, _ := registryErr(t, r); r.status != 404 || code != "NAME_UNKNOWN" {
					t.Fatalf("gone answered %d %s", r.status, code)
				}
				r = e.history("acme/"+denied.Path, tags[denied.UID], registryToken, "")
				if code, _ := registryErr(t, r); r.status != 403 || code != "DENIED" {
					t.Fatalf("denied answered %d %s", r.status, code)
				}
				other := nestedRepo(t, e, 1)
				e.mustStatus(e.history("acme/"+other.Path, tags[other.UID], registryToken, ""), http.StatusOK)
				if n := e.sim.RemoveFaults("gone"); n != 1 {
					t.Fatalf("removed %d faults", n)
				}
				e.mustStatus(e.history("acme/"+gone.Path, tags[gone.UID], registryToken, ""), http.StatusOK)
				e.mustStatus(e.do(http.MethodDelete, "/_sim/faults?name=denied", "", nil), http.StatusOK)
				e.mustStatus(e.history("acme/"+denied.Path, tags[denied.UID], registryToken, ""), http.StatusOK)
			},
		},
		{name: "Fault_ImageFaultThroughControlAPI", opts: strict, run: func(t *testing.T, e *env) {
			tg, image := e.privateTag("")
			r := e.do(http.MethodPost, "/_sim/faults", "", map[string]any{"faults": []map[string]any{
				{"name": "x", "image": image, "status": 403}}})
			e.mustStatus(r, http.StatusOK)
			e.mustStatus(e.history(image, tg.Name, registryToken, ""), http.StatusForbidden)
			e.mustStatus(e.tokenScope(image, "Bearer "+registryToken), http.StatusForbidden)
			faults := e.do(http.MethodGet, "/_sim/faults", "", nil)
			if !strings.Contains(string(faults.raw), `"image":"`+image+`"`) {
				t.Fatalf("faults=%s", faults.raw)
			}
			e.mustStatus(e.do(http.MethodDelete, "/_sim/faults?name=x", "", nil), http.StatusOK)
			e.mustStatus(e.history(image, tg.Name, registryToken, ""), http.StatusOK)
		}},
		{name: "Fault_PlatformPathStatusIsAIP193", run: func(t *testing.T, e *env) {
			rp := e.sim.Truth().Repos[0]
			e.sim.AddFaults(platformsim.Fault{Path: "/registry/v2/repos/" + rp.UID, Status: http.StatusNotFound})
			r := e.get("/registry/v2/repos/" + rp.UID)
			e.mustStatus(r, http.StatusNotFound)
			if r.body["code"] != float64(5) {
				t.Fatalf("body=%s", r.raw)
			}
			e.mustStatus(e.get("/registry/v2/repos/"+e.sim.Truth().Repos[1].UID), http.StatusOK)
		}},
	})
}
