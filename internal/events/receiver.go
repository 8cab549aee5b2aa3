package events

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
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
// redelivered event is acknowledged without doing its work twice. The
// receiver also records there the tokens it accepted (as ids beginning with
// "token:"), so that a token replayed after a restart is still refused.
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
	// TypePrefix begins the event types of this deployment, such as
	// "dev.chainguard." (the vendor word differs per deployment; the
	// config's EventTypePrefix gives it); types without it are ignored.
	TypePrefix string
	// MaxBody bounds a delivery's body; default 1 MiB.
	MaxBody int64
	// QueueSize bounds accepted work waiting for the crawler; when it is full
	// deliveries get 503 so the sender retries. Default 1024.
	QueueSize int
	// Workers run queued jobs; default 2.
	Workers int
	// MaxTokenAge refuses tokens issued (iat) longer ago than this, whatever
	// their exp says, so that a captured delivery is useless soon after it
	// was sent. The platform signs a fresh token for every attempt, so its
	// retries are not affected. Default 10 minutes.
	MaxTokenAge time.Duration
	// ClockSkew is how far the issuer's clock may be from ours when
	// checking iat; default 1 minute.
	ClockSkew time.Duration
	// KeyRefreshInterval is how often, at most, the issuer's key set is
	// fetched again, and only for a token naming a key id not in it;
	// default DefaultKeyRefreshInterval.
	KeyRefreshInterval time.Duration
	HTTPClient         *http.Client // for discovery and JWKS
	Now                func() time.Time
	Logger             *slog.Logger
}

// Stats counts what the receiver did, by outcome.
type Stats struct {
	// Accepted counts deliveries answered 202 whose work was queued, or
	// merged into the same work already queued (those also count in
	// Coalesced).
	Accepted, Duplicate, Ignored, Unknown atomic.Int64
	// Coalesced counts accepted deliveries that asked for a refresh
	// already waiting in the queue, so they added no work.
	Coalesced    atomic.Int64
	Rejected     sync.Map // reason -> *atomic.Int64
	Done, Failed atomic.Int64
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
	groups     map[string]bool
	tokens     *usedTokens
	Stats      Stats

	mu       sync.Mutex
	verifier *oidc.IDTokenVerifier

	// queue holds jobs for the workers; pending holds the keys of the jobs
	// in it, so that a second job for one resource is not queued.
	queueMu sync.Mutex
	queue   chan job
	pending map[string]bool
}

// job is a refresh a delivery asked for.
type job struct {
	// key names what the job refreshes; two jobs with one key do the same.
	key     string
	id, typ string
	run     func(ctx context.Context) error
}

// NewReceiver returns a Receiver; call Run to work its queue.
func NewReceiver(cfg Config, jobs Jobs, deliveries Deliveries) *Receiver {
	if cfg.Audience == "" {
		cfg.Audience = "customer"
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
	if cfg.MaxTokenAge <= 0 {
		cfg.MaxTokenAge = 10 * time.Minute
	}
	if cfg.ClockSkew <= 0 {
		cfg.ClockSkew = time.Minute
	}
	if cfg.KeyRefreshInterval <= 0 {
		cfg.KeyRefreshInterval = DefaultKeyRefreshInterval
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
	return &Receiver{cfg: cfg, jobs: jobs, deliveries: deliveries, log: cfg.Logger, groups: groups,
		tokens: newUsedTokens(), queue: make(chan job, cfg.QueueSize), pending: map[string]bool{}}
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
					r.started(j)
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
	var meta struct {
		JWKS string   `json:"jwks_uri"`
		Algs []string `json:"id_token_signing_alg_values_supported"`
	}
	if err := p.Claims(&meta); err != nil || meta.JWKS == "" {
		return nil, fmt.Errorf("discover OIDC issuer %s: no jwks_uri in its discovery document (%v)", r.cfg.Issuer, err)
	}
	keys := newKeySet(meta.JWKS, r.cfg.HTTPClient, r.cfg.Now, r.cfg.KeyRefreshInterval)
	r.verifier = oidc.NewVerifier(
		r.cfg.Issuer,
		keys,
		&oidc.Config{ClientID: r.cfg.Audience, Now: r.cfg.Now, SupportedSigningAlgs: meta.Algs},
	)
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
	// ReasonExpiredToken: the token is past its exp (403).
	ReasonExpiredToken = "token_expired"
	// ReasonTokenTooOld: the token was issued longer ago than
	// Config.MaxTokenAge allows (403).
	ReasonTokenTooOld = "token_too_old"
	// ReasonReplayed: the token already carried another delivery (409).
	ReasonReplayed = "replayed_token"
	// ReasonTypeMismatch: Ce-Type names a kind of event whose body is not
	// the signed body's kind (403).
	ReasonTypeMismatch = "type_body_mismatch"
	// ReasonSubjectMismatch: Ce-Subject names another resource than the
	// signed body (403).
	ReasonSubjectMismatch = "subject_body_mismatch"
)

// RejectReasons lists every rejection reason, for metrics.
func RejectReasons() []string {
	return []string{ReasonMethod, ReasonNoToken, ReasonBadToken, ReasonWrongSubject, ReasonBadDigest,
		ReasonTooLarge, ReasonMalformed, ReasonQueueFull, ReasonUnavailable, ReasonExpiredToken,
		ReasonTokenTooOld, ReasonReplayed, ReasonTypeMismatch, ReasonSubjectMismatch}
}

// rejection is why a delivery is refused: the status to answer, the reason
// counted in Stats, and a message for whoever reads the answer.
type rejection struct {
	status      int
	reason, msg string
}

func refusal(status int, reason, format string, args ...any) *rejection {
	return &rejection{status: status, reason: reason, msg: fmt.Sprintf(format, args...)}
}

func (r *Receiver) refuse(w http.ResponseWriter, rej *rejection) {
	r.Stats.reject(rej.reason)
	r.log.Info("rejected pushed event", "status", rej.status, "reason", rej.reason, "detail", rej.msg)
	w.Header().Set("Content-Type", "application/json")
	if rej.status == http.StatusServiceUnavailable {
		w.Header().Set("Retry-After", "1")
	}
	w.WriteHeader(rej.status)
	json.NewEncoder(w).Encode(map[string]string{"error": rej.reason, "message": rej.msg})
}

// ServeHTTP verifies a delivery, and queues the work it asks for. It answers
// within milliseconds: the work itself happens on the queue.
func (r *Receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	d, rej := r.verify(w, req)
	if rej != nil {
		r.refuse(w, rej)
		return
	}
	status, rej := r.accept(req.Context(), d)
	if rej != nil {
		r.refuse(w, rej)
		return
	}
	w.WriteHeader(status)
}
