package events_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-jose/go-jose/v4"
	"github.com/go-jose/go-jose/v4/jwt"

	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

const simToken = "sim-token"

// delivery is a request the simulator sent to a sink, kept for replay.
type delivery struct {
	header http.Header
	body   []byte
}

// capture is a sink that records deliveries.
type capture struct {
	mu  sync.Mutex
	got []delivery
}

func (c *capture) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	c.mu.Lock()
	c.got = append(c.got, delivery{r.Header.Clone(), b})
	c.mu.Unlock()
	w.WriteHeader(http.StatusAccepted)
}

// nth waits for the n-th delivery (from 1) of type typ.
func (c *capture) nth(t *testing.T, typ string, n int) delivery {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		c.mu.Lock()
		seen := 0
		for _, d := range c.got {
			if strings.HasSuffix(d.header.Get("Ce-Type"), typ) {
				if seen++; seen == n {
					c.mu.Unlock()
					return d
				}
			}
		}
		c.mu.Unlock()
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatalf("no %d. %s delivery arrived", n, typ)
	return delivery{}
}

// recordedJobs is the crawler side of the receiver: it records what it was
// asked to refresh.
type recordedJobs struct {
	mu    sync.Mutex
	calls []string
}

func (j *recordedJobs) add(s string) error {
	j.mu.Lock()
	j.calls = append(j.calls, s)
	j.mu.Unlock()
	return nil
}
func (j *recordedJobs) RefreshTag(_ context.Context, repo, tag string) error {
	return j.add("tag " + repo + " " + tag)
}
func (j *recordedJobs) RefreshRepo(_ context.Context, repo string) error {
	return j.add("repo " + repo)
}
func (j *recordedJobs) RefreshRepos(context.Context) error { return j.add("repos") }
func (j *recordedJobs) list() []string {
	j.mu.Lock()
	defer j.mu.Unlock()
	return append([]string(nil), j.calls...)
}

// memDeliveries remembers delivery ids in memory.
type memDeliveries struct {
	mu   sync.Mutex
	seen map[string]bool
}

func (m *memDeliveries) FirstDelivery(_ context.Context, id string) (bool, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.seen == nil {
		m.seen = map[string]bool{}
	}
	if m.seen[id] {
		return false, nil
	}
	m.seen[id] = true
	return true, nil
}

func (m *memDeliveries) ForgetDelivery(_ context.Context, id string) error {
	m.mu.Lock()
	delete(m.seen, id)
	m.mu.Unlock()
	return nil
}

type fixture struct {
	sim     *platformsim.Sim
	simURL  string
	sink    *capture
	pushes  int // push deliveries captured so far
	pushed  delivery
	tagUID  string
	repoUID string
	tagName string
}

// newFixture makes the simulator deliver a real signed push event, captured
// for replay against receivers configured by each test.
func newFixture(t *testing.T, opts platformsim.Options) *fixture {
	t.Helper()
	opts.Seed, opts.Tokens, opts.AllowHTTPSinks = 5, []string{simToken}, true
	sim := platformsim.New(opts)
	sim.Populate(platformsim.Scale{Repos: 2, TagsPerRepo: 2, HistoryPerTag: 2})
	srv := httptest.NewServer(sim.Handler())
	t.Cleanup(srv.Close)
	t.Cleanup(sim.Close)
	sim.SetBaseURL(srv.URL)
	sink := &capture{}
	sinkSrv := httptest.NewServer(sink)
	t.Cleanup(sinkSrv.Close)

	body, _ := json.Marshal(map[string]string{"sink": sinkSrv.URL})
	req, _ := http.NewRequest(http.MethodPost, srv.URL+"/events/v2/subscriptions/org1", bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+simToken)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("create subscription: %d", resp.StatusCode)
	}
	tag := sim.Truth().Tags[0]
	f := &fixture{sim: sim, simURL: srv.URL, sink: sink, tagUID: tag.UID, repoUID: tag.RepoUID, tagName: tag.Name}
	f.pushed = f.push(t, tag)
	return f
}

// push moves tag to a new digest and returns the push delivery the
// simulator signed for it.
func (f *fixture) push(t *testing.T, tag platformsim.TruthTag) delivery {
	t.Helper()
	f.pushes++
	if err := f.sim.MoveTag(tag.UID, fmt.Sprintf("sha256:%064x", f.pushes)); err != nil {
		t.Fatal(err)
	}
	return f.sink.nth(t, "registry.push.v1", f.pushes)
}

func (f *fixture) receiver(t *testing.T, mod func(*events.Config)) (*events.Receiver, *recordedJobs, string) {
	t.Helper()
	cfg := events.Config{Issuer: f.simURL, Groups: []string{"org1"}, TypePrefix: "dev.chainguard.", Now: f.sim.Now}
	if mod != nil {
		mod(&cfg)
	}
	return serveReceiver(t, cfg, &memDeliveries{})
}

// serveReceiver serves a receiver on a loopback port; its queue runs only
// once the test calls runQueue.
func serveReceiver(
	t *testing.T,
	cfg events.Config,
	deliveries events.Deliveries,
) (*events.Receiver, *recordedJobs, string) {
	t.Helper()
	jobs := &recordedJobs{}
	rcv := events.NewReceiver(cfg, jobs, deliveries)
	srv := httptest.NewServer(rcv)
	t.Cleanup(srv.Close)
	return rcv, jobs, srv.URL
}

func post(t *testing.T, url string, h http.Header, body []byte) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(body))
	req.Header = h.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func runQueue(t *testing.T, rcv *events.Receiver) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { rcv.Run(ctx); close(done) }()
	t.Cleanup(func() { cancel(); <-done })
}

func waitJobs(t *testing.T, jobs *recordedJobs, n int) []string {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for len(jobs.list()) < n && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return jobs.list()
}

// TestReceiver_DiscoversIssuerAtStart: Run fetches the issuer's discovery
// document before any push arrives.
func TestReceiver_DiscoversIssuerAtStart(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	rcv, _, _ := f.receiver(t, nil)
	const discovery = "GET /.well-known/openid-configuration"
	before := f.sim.Stats().ByEndpoint[discovery]
	runQueue(t, rcv)
	deadline := time.Now().Add(5 * time.Second)
	for f.sim.Stats().ByEndpoint[discovery] == before {
		if time.Now().After(deadline) {
			t.Fatal("no discovery request within 5s of Run")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestReceiver_AcceptsSignedPushAndDeduplicates(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	rcv, jobs, url := f.receiver(t, nil)
	runQueue(t, rcv)
	if code, body := post(t, url, f.pushed.header, f.pushed.body); code != http.StatusAccepted {
		t.Fatalf("status=%d body=%s, want 202", code, body)
	}
	got := waitJobs(t, jobs, 1)
	if want := "tag " + f.repoUID + " " + f.tagName; len(got) != 1 || got[0] != want {
		t.Fatalf("jobs=%q, want [%q]", got, want)
	}
	// A redelivery (same Ce-Id) is acknowledged and does no work.
	if code, _ := post(t, url, f.pushed.header, f.pushed.body); code != http.StatusOK {
		t.Fatalf("redelivery status=%d, want 200", code)
	}
	if got := rcv.Stats.Duplicate.Load(); got != 1 {
		t.Fatalf("duplicates=%d, want 1", got)
	}
	if got := len(jobs.list()); got != 1 {
		t.Fatalf("jobs after redelivery=%d, want 1", got)
	}
}

// forge signs claims with a key the issuer never published.
func forge(t *testing.T, claims map[string]any) string {
	t.Helper()
	_, signer := newSigner(t, "forged")
	tok, err := jwt.Signed(signer).Claims(claims).Serialize()
	if err != nil {
		t.Fatal(err)
	}
	return tok
}

func TestReceiver_RejectsForgeries(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	wrongAud := newFixture(t, platformsim.Options{EventAudience: "someone-else"})

	withAuth := func(h http.Header, v string) http.Header {
		h = h.Clone()
		if v == "" {
			h.Del("Authorization")
		} else {
			h.Set("Authorization", v)
		}
		return h
	}
	var claims map[string]any
	{
		tok := strings.TrimPrefix(f.pushed.header.Get("Authorization"), "Bearer ")
		parsed, err := jwt.ParseSigned(tok, []jose.SignatureAlgorithm{jose.RS256})
		if err != nil {
			t.Fatal(err)
		}
		if err := parsed.UnsafeClaimsWithoutVerification(&claims); err != nil {
			t.Fatal(err)
		}
	}
	tampered := bytes.Replace(f.pushed.body, []byte(f.tagName), []byte("other-tag"), 1)
	if bytes.Equal(tampered, f.pushed.body) {
		t.Fatal("could not tamper with the body")
	}
	big := append(bytes.Repeat([]byte(" "), 2<<20), f.pushed.body...)
	noID := f.pushed.header.Clone()
	noID.Del("Ce-Id")
	reservedID := f.pushed.header.Clone()
	reservedID.Set("Ce-Id", "token:jti:x")

	for _, tc := range []struct {
		name   string
		fix    *fixture
		mod    func(*events.Config)
		header http.Header
		body   []byte
		status int
		reason string
	}{
		{"MissingToken", f, nil, withAuth(f.pushed.header, ""), f.pushed.body, 401, events.ReasonNoToken},
		{"Forged", f, nil, withAuth(f.pushed.header, "Bearer "+forge(t, claims)), f.pushed.body, 403, events.ReasonBadToken},
		{"Garbage", f, nil, withAuth(f.pushed.header, "Bearer not.a.jwt"), f.pushed.body, 403, events.ReasonBadToken},
		{"TamperedBody", f, nil, f.pushed.header, tampered, 403, events.ReasonBadDigest},
		{
			"Expired",
			f,
			func(c *events.Config) { c.Now = func() time.Time { return f.sim.Now().Add(time.Hour) } },
			f.pushed.header,
			f.pushed.body,
			403,
			events.ReasonExpiredToken,
		},
		{"WrongAudience", wrongAud, nil, wrongAud.pushed.header, wrongAud.pushed.body, 403, events.ReasonBadToken},
		{
			"WrongSubject",
			f,
			func(c *events.Config) { c.Groups = []string{"another-group"} },
			f.pushed.header,
			f.pushed.body,
			403,
			events.ReasonWrongSubject,
		},
		{"TooLarge", f, nil, f.pushed.header, big, 413, events.ReasonTooLarge},
		{"NoCloudEventID", f, nil, noID, f.pushed.body, 400, events.ReasonMalformed},
		{"ReservedCloudEventID", f, nil, reservedID, f.pushed.body, 400, events.ReasonMalformed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv, jobs, url := tc.fix.receiver(t, tc.mod)
			runQueue(t, rcv)
			code, body := post(t, url, tc.header, tc.body)
			if code != tc.status {
				t.Fatalf("status=%d body=%s, want %d", code, body, tc.status)
			}
			if !strings.Contains(body, tc.reason) {
				t.Errorf("body=%s, want reason %q", body, tc.reason)
			}
			if got := rcv.Stats.RejectedCount(tc.reason); got != 1 {
				t.Errorf("rejected[%s]=%d, want 1", tc.reason, got)
			}
			if got := jobs.list(); len(got) != 0 {
				t.Fatalf("jobs=%q, want none", got)
			}
		})
	}
}

func TestReceiver_QueueFullAnswers503(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	// A push of another tag: work that cannot join the first.
	other := f.push(t, f.sim.Truth().Tags[2])
	rcv, jobs, url := f.receiver(t, func(c *events.Config) { c.QueueSize = 1 })
	// No worker runs: the first delivery fills the queue.
	if code, body := post(t, url, f.pushed.header, f.pushed.body); code != 202 {
		t.Fatalf("first: %d %s", code, body)
	}
	req, _ := http.NewRequest(http.MethodPost, url, bytes.NewReader(other.body))
	req.Header = other.header.Clone()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf(
			"second: status=%d Retry-After=%q, want 503 with Retry-After",
			resp.StatusCode,
			resp.Header.Get("Retry-After"),
		)
	}
	// Once the queue drains, the sender's retry of the refused delivery
	// (here the very same request: its token was not used up) is accepted
	// as new.
	runQueue(t, rcv)
	waitJobs(t, jobs, 1)
	deadline := time.Now().Add(5 * time.Second)
	for {
		code, _ := post(t, url, other.header, other.body)
		if code == http.StatusAccepted {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("retry after the queue drained: status %d, want 202", code)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if got := waitJobs(t, jobs, 2); len(got) != 2 {
		t.Fatalf("jobs=%q, want 2", got)
	}
}

// FuzzReceiver sends arbitrary deliveries: without a token the issuer
// signed, none may be accepted, and none may crash the receiver.
func FuzzReceiver(f *testing.F) {
	f.Add(
		"Bearer x.y.z",
		"dev.chainguard.registry.push.v1",
		"id-1",
		[]byte(`{"body":{"repo_id":"org1/r","tag":"latest","type":"manifest"}}`),
	)
	f.Add("", "", "", []byte(""))
	f.Add(
		"Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJ3ZWJob29rOm9yZzEifQ.",
		"dev.chainguard.registry.push.v1",
		"id-2",
		[]byte(`{}`),
	)
	f.Add("Basic dXNlcjpwYXNz", "x", "y", []byte("\x00\xff"))
	sim := platformsim.New(platformsim.Options{Seed: 1, Tokens: []string{simToken}})
	srv := httptest.NewServer(sim.Handler())
	f.Cleanup(srv.Close)
	sim.SetBaseURL(srv.URL)
	rcv := events.NewReceiver(
		events.Config{Issuer: srv.URL, Groups: []string{"org1"}, TypePrefix: "dev.chainguard.", MaxBody: 4096},
		&recordedJobs{},
		&memDeliveries{},
	)
	f.Fuzz(func(t *testing.T, auth, typ, id string, body []byte) {
		req := httptest.NewRequest(http.MethodPost, "/", bytes.NewReader(body))
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		req.Header.Set("Ce-Type", typ)
		req.Header.Set("Ce-Id", id)
		req.Header.Set("Ce-Specversion", "1.0")
		rec := httptest.NewRecorder()
		rcv.ServeHTTP(rec, req)
		if rec.Code < 400 {
			t.Fatalf("accepted a forged delivery: %d", rec.Code)
		}
	})
}
