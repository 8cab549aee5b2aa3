// Package events is syncd's fast path: it registers a subscription with the
// platform so that changes are pushed to syncd, verifies each pushed
// CloudEvent, and maps it to the crawler job that refreshes what changed.
package events

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
)

// Jobs is what a verified event asks of the crawler.
type Jobs interface {
	// RefreshTag re-reads one tag of a repo and its history. repo is the
	// repo's uid, or its name when the event carried no uid.
	RefreshTag(ctx context.Context, repo, tag string) error
	// RefreshRepo re-reads one repo's tags (and the history of changed ones).
	RefreshRepo(ctx context.Context, repoUID string) error
	// RefreshRepos re-reads the repo list.
	RefreshRepos(ctx context.Context) error
}

// Deliveries remembers which event ids were accepted, across restarts, so a
// redelivered event is acknowledged without doing its work twice.
type Deliveries interface {
	// FirstDelivery records id and reports whether it is new.
	FirstDelivery(ctx context.Context, id string) (bool, error)
	// ForgetDelivery removes id, so that a retry of a delivery whose work
	// could not be queued is taken as new.
	ForgetDelivery(ctx context.Context, id string) error
}

// Config configures a Receiver.
type Config struct {
	// Issuer is the vendor's OIDC issuer; its discovery document and JWKS
	// verify the bearer token of every delivery.
	Issuer string
	// Audience the token must be issued for; default "customer".
	Audience string
	// Groups are the uids of the subscribing groups: the token's subject
	// must be webhook:<one of them>.
	Groups []string
	// TypePrefix begins the event types of this deployment; default
	// "dev.chainguard." (the vendor word differs per deployment).
	TypePrefix string
	// MaxBody bounds a delivery's body; default 1 MiB.
	MaxBody int64
	// QueueSize bounds accepted work waiting for the crawler; when it is full
	// deliveries get 503 so the sender retries. Default 1024.
	QueueSize int
	// Workers run queued jobs; default 2.
	Workers    int
	HTTPClient *http.Client // for discovery and JWKS
	Now        func() time.Time
	Logger     *slog.Logger
}

// Stats counts what the receiver did, by outcome.
type Stats struct {
	Accepted, Duplicate, Ignored, Unknown atomic.Int64
	Rejected                              sync.Map // reason -> *atomic.Int64
	Done, Failed                          atomic.Int64
}

func (s *Stats) reject(reason string) {
	v, _ := s.Rejected.LoadOrStore(reason, new(atomic.Int64))
	v.(*atomic.Int64).Add(1)
}

// RejectedCount returns how many deliveries were rejected for reason.
func (s *Stats) RejectedCount(reason string) int64 {
	if v, ok := s.Rejected.Load(reason); ok {
		return v.(*atomic.Int64).Load()
	}
	return 0
}

// Receiver is the HTTP endpoint the platform delivers events to.
type Receiver struct {
	cfg        Config
	jobs       Jobs
	deliveries Deliveries
	log        *slog.Logger
	queue      chan job
	groups     map[string]bool
	Stats      Stats

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier
}

type job struct {
	id, typ string
	run     func(ctx context.Context) error
}

// NewReceiver returns a Receiver; call Run to work its queue.
func NewReceiver(cfg Config, jobs Jobs, deliveries Deliveries) *Receiver {
	if cfg.Audience == "" {
		cfg.Audience = "customer"
	}
	if cfg.TypePrefix == "" {
		cfg.TypePrefix = "dev.chainguard."
	}
	if cfg.MaxBody <= 0 {
		cfg.MaxBody = 1 << 20
	}
	if cfg.QueueSize <= 0 {
		cfg.QueueSize = 1024
	}
	if cfg.Workers <= 0 {
		cfg.Workers = 2
	}
	if cfg.HTTPClient == nil {
		cfg.HTTPClient = &http.Client{Timeout: 10 * time.Second}
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	groups := make(map[string]bool, len(cfg.Groups))
	for _, g := range cfg.Groups {
		groups[g] = true
	}
	return &Receiver{cfg: cfg, jobs: jobs, deliveries: deliveries, log: cfg.Logger, queue: make(chan job, cfg.QueueSize), groups: groups}
}

// Run works the queue until ctx is done. It discovers the issuer at once
// rather than at the first push, so that the first push waits for nothing
// and an issuer that cannot be reached shows in the log at start.
func (r *Receiver) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	wg.Go(func() {
		if _, err := r.getVerifier(ctx); err != nil && ctx.Err() == nil {
			r.log.Warn("OIDC issuer discovery failed; trying again at the first push", "issuer", r.cfg.Issuer, "err", err)
		}
	})
	for range r.cfg.Workers {
		wg.Go(func() {
			for {
				select {
				case <-ctx.Done():
					return
				case j := <-r.queue:
					if err := j.run(ctx); err != nil {
						if ctx.Err() != nil {
							return
						}
						r.Stats.Failed.Add(1)
						r.log.Warn("pushed event's refresh failed; the next crawl will catch it", "type", j.typ, "id", j.id, "err", err)
						continue
					}
					r.Stats.Done.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return nil
}

// getVerifier discovers the issuer on first use, and again after a failure,
// so that syncd starts even while the issuer is unreachable.
func (r *Receiver) getVerifier(ctx context.Context) (*oidc.IDTokenVerifier, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.verifier != nil {
		return r.verifier, nil
	}
	// Discovery outlives the request that triggered it.
	dctx := oidc.ClientContext(context.WithoutCancel(ctx), r.cfg.HTTPClient)
	p, err := oidc.NewProvider(dctx, r.cfg.Issuer)
	if err != nil {
		return nil, fmt.Errorf("discover OIDC issuer %s: %w", r.cfg.Issuer, err)
	}
	r.verifier = p.Verifier(&oidc.Config{ClientID: r.cfg.Audience, Now: r.cfg.Now})
	return r.verifier, nil
}

// Rejection reasons, as counted in Stats and shown in error bodies.
const (
	ReasonMethod       = "method"
	ReasonNoToken      = "missing_token"
	ReasonBadToken     = "invalid_token"
	ReasonWrongSubject = "wrong_subject"
	ReasonBadDigest    = "body_digest_mismatch"
	ReasonTooLarge     = "body_too_large"
	ReasonMalformed    = "malformed"
	ReasonQueueFull    = "queue_full"
	ReasonUnavailable  = "issuer_unavailable"
)

// RejectReasons lists every rejection reason, for metrics.
func RejectReasons() []string {
	return []string{ReasonMethod, ReasonNoToken, ReasonBadToken, ReasonWrongSubject, ReasonBadDigest,
		ReasonTooLarge, ReasonMalformed, ReasonQueueFull, ReasonUnavailable}
}

func (r *Receiver) fail(w http.ResponseWriter, status int, reason, msg string) {
	r.Stats.reject(reason)
	r.log.Info("rejected pushed event", "status", status, "reason", reason, "detail", msg)
	w.Header().Set("Content-Type", "application/json")
	if status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(map[string]string{"error": reason, "message": msg})
}

// ServeHTTP verifies a delivery, and queues the work it asks for. It answers
// within milliseconds: the work itself happens on the queue.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		r.fail(w, http.StatusMethodNotAllowed, ReasonMethod, "deliveries are POSTs")
		return
	}
	raw, ok := strings.CutPrefix(req.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(raw) == "" {
		w.Header().Set("WWW-Authenticate", `Bearer realm="syncd"`)
		r.fail(w, http.StatusUnauthorized, ReasonNoToken, "a bearer token is required")
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, r.cfg.MaxBody))
	if err != nil {
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			r.fail(w, http.StatusRequestEntityTooLarge, ReasonTooLarge, fmt.Sprintf("the body exceeds %d bytes", r.cfg.MaxBody))
			return
		}
		r.fail(w, http.StatusBadRequest, ReasonMalformed, "could not read the body")
		return
	}
	verifier, err := r.getVerifier(req.Context())
	if err != nil {
		r.log.Warn("cannot verify pushed events", "err", err)
		r.fail(w, http.StatusServiceUnavailable, ReasonUnavailable, "the token issuer cannot be reached; retry later")
		return
	}
	tok, err := verifier.Verify(req.Context(), raw)
	if err != nil {
		r.fail(w, http.StatusForbidden, ReasonBadToken, "the token did not verify")
		r.log.Debug("token verification failed", "err", err)
		return
	}
	group, ok := strings.CutPrefix(tok.Subject, "webhook:")
	if !ok || !r.groups[group] {
		r.fail(w, http.StatusForbidden, ReasonWrongSubject, "the token's subject is not a subscribed group")
		return
	}
	var claims struct {
		Webhook struct {
			Digest string `json:"digest"`
		} `json:"webhook"`
	}
	sum := sha256.Sum256(body)
	if err := tok.Claims(&claims); err != nil || claims.Webhook.Digest != "sha256:"+hex.EncodeToString(sum[:]) {
		r.fail(w, http.StatusForbidden, ReasonBadDigest, "the token's webhook digest does not match the body")
		return
	}
	id, typ := req.Header.Get("Ce-Id"), req.Header.Get("Ce-Type")
	if id == "" || typ == "" || req.Header.Get("Ce-Specversion") == "" {
		r.fail(w, http.StatusBadRequest, ReasonMalformed, "Ce-Id, Ce-Type and Ce-Specversion headers are required (CloudEvents binary mode)")
		return
	}
	j, err := r.mapEvent(id, typ, req.Header.Get("Ce-Subject"), body)
	if err != nil {
		r.fail(w, http.StatusBadRequest, ReasonMalformed, err.Error())
		return
	}
	fresh, err := r.deliveries.FirstDelivery(req.Context(), id)
	if err != nil {
		r.log.Warn("cannot record delivery", "id", id, "err", err)
		r.fail(w, http.StatusServiceUnavailable, ReasonUnavailable, "cannot record the delivery; retry later")
		return
	}
	if !fresh {
		r.Stats.Duplicate.Add(1)
		w.WriteHeader(http.StatusOK)
		return
	}
	if j == nil {
		w.WriteHeader(http.StatusAccepted)
		return
	}
	select {
	case r.queue <- *j:
		r.Stats.Accepted.Add(1)
		w.WriteHeader(http.StatusAccepted)
	default:
		// The id is recorded but the work is not queued: forget it so the
		// sender's retry is taken as new.
		if err := r.deliveries.ForgetDelivery(context.WithoutCancel(req.Context()), id); err != nil {
			r.log.Warn("cannot forget delivery", "id", id, "err", err)
		}
		r.fail(w, http.StatusServiceUnavailable, ReasonQueueFull, "too much work queued; retry later")
	}
}
