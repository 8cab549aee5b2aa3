package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/syncd-dev/syncd/internal/store"
)

// Mirror is what the service reads.
type Mirror interface {
	ReadMirror(ctx context.Context, fn func(*store.MirrorRead) error) error
}

// Config configures a Service.
type Config struct {
	// Prefix begins every request subject: <Prefix>.tag.at, … It must lie
	// outside the stream's subjects.
	Prefix string
	// Name is the micro service's name; default "syncd".
	Name string
	// Version is syncd's; one that is not semantic (a development build)
	// is shown as 0.0.0-devel.
	Version string
	// QueueGroup is the queue group every replica joins; default "syncd".
	QueueGroup string
	// MaxWait bounds the wait for a request's min_seq; default 5s.
	MaxWait time.Duration
	// MaxLimit caps the records, tags, intervals or advisories of one
	// answer; default 1000.
	MaxLimit int
	// Concurrency is how many requests are read from the mirror at once;
	// default 4.
	Concurrency int
	// MaxPending is how many requests may be queued or waiting for their
	// min_seq; one more is refused (503 busy). Default 256.
	MaxPending int
	// Timeout bounds one answer's reading; default 10s.
	Timeout time.Duration
	// Now is the clock of "ago"; default time.Now.
	Now func() time.Time
	// Role names the replica's role now; default "leader".
	Role func() string
	// Lag is how many stream messages the mirror has yet to apply; nil: 0.
	Lag func() uint64
	// Refresh, when set, learns the position from NATS (what the consumer
	// acknowledged, or a leader's stream): when the service starts, and
	// when a request's min_seq is beyond the position it knows.
	Refresh func(ctx context.Context) (uint64, error)
	// RefreshEvery is the least time between two refreshes; default 100ms.
	RefreshEvery time.Duration
	Logger       *slog.Logger
}

func (c *Config) defaults() {
	if c.Name == "" {
		c.Name = "syncd"
	}
	c.Version = strings.TrimPrefix(c.Version, "v")
	if !semver.MatchString(c.Version) {
		c.Version = "0.0.0-devel"
	}
	if c.QueueGroup == "" {
		c.QueueGroup = "syncd"
	}
	if c.MaxWait <= 0 {
		c.MaxWait = 5 * time.Second
	}
	if c.MaxLimit <= 0 {
		c.MaxLimit = 1000
	}
	if c.Concurrency <= 0 {
		c.Concurrency = 4
	}
	if c.MaxPending <= 0 {
		c.MaxPending = 256
	}
	if c.Timeout <= 0 {
		c.Timeout = 10 * time.Second
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	if c.Role == nil {
		c.Role = func() string { return "leader" }
	}
	if c.Lag == nil {
		c.Lag = func() uint64 { return 0 }
	}
	if c.RefreshEvery <= 0 {
		c.RefreshEvery = 100 * time.Millisecond
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
}

// semver is what micro accepts as a version (semver.org's expression).
var semver = regexp.MustCompile(
	`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$`,
)

// maxRequest is the largest request body read; a larger one is refused.
const maxRequest = 64 << 10

// Service answers queries from a mirror over NATS.
type Service struct {
	cfg    Config
	nc     *nats.Conn
	mirror Mirror
	pos    *Position
	log    *slog.Logger

	svc   micro.Service
	queue chan *job
	// pending counts the requests taken and not yet answered.
	pending atomic.Int64
	// mu guards closed: no request is queued once it is set.
	mu     sync.RWMutex
	closed bool
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	ready       atomic.Bool
	refreshing  atomic.Bool
	lastRefresh atomic.Int64
	stats       map[string]*endpointStats
}

// job is one request, from its arrival to its answer.
type job struct {
	ep     *endpoint
	reply  string
	data   []byte
	req    request
	waited bool
}

// New returns a service answering from mirror at position pos on nc;
// Start starts it.
func New(nc *nats.Conn, mirror Mirror, pos *Position, cfg Config) *Service {
	cfg.defaults()
	s := &Service{cfg: cfg, nc: nc, mirror: mirror, pos: pos, log: cfg.Logger,
		queue: make(chan *job, cfg.MaxPending), stats: make(map[string]*endpointStats)}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	for _, ep := range endpoints {
		s.stats[ep.name] = &endpointStats{}
	}
	return s
}

// Start registers the service and its endpoints with NATS and starts the
// workers.
func (s *Service) Start() error {
	svc, err := micro.AddService(s.nc, micro.Config{
		Name:         s.cfg.Name,
		Version:      s.cfg.Version,
		Description:  "syncd's mirror: tags at any instant, where a digest has been, repo tags, advisories, the replica's position",
		QueueGroup:   s.cfg.QueueGroup,
		Metadata:     map[string]string{"prefix": s.cfg.Prefix},
		StatsHandler: func(e *micro.Endpoint) any { return s.stats[e.Name].snapshot() },
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			s.log.Warn("query service: NATS error", "subject", err.Subject, "err", err.Description)
		},
	})
	if err != nil {
		return fmt.Errorf("add query service: %w", err)
	}
	g := svc.AddGroup(s.cfg.Prefix)
	for _, ep := range endpoints {
		if err := g.AddEndpoint(ep.name, micro.HandlerFunc(s.take(ep)), micro.WithEndpointSubject(ep.subject),
			micro.WithEndpointMetadata(map[string]string{"request": ep.doc})); err != nil {
			svc.Stop()
			return fmt.Errorf("add query endpoint %s: %w", ep.subject, err)
		}
	}
	// Once the server has the subscriptions, a request finds a responder.
	// Without a connection they go out when it is back.
	if err := s.nc.FlushTimeout(5 * time.Second); err != nil {
		s.log.Warn("query service: NATS has not confirmed its subscriptions yet", "err", err)
	}
	s.svc = svc
	for range s.cfg.Concurrency {
		s.wg.Add(1)
		go s.work()
	}
	if s.cfg.Refresh != nil {
		s.wg.Add(1)
		go s.prime()
	}
	s.log.Info(
		"query service listening",
		"subjects",
		s.cfg.Prefix+".>",
		"queue_group",
		s.cfg.QueueGroup,
		"id",
		svc.Info().ID,
	)
	return nil
}

// Stop unsubscribes, answers what is queued or waiting 503 (stopping),
// and waits for the workers.
func (s *Service) Stop() {
	if s.svc != nil {
		if err := s.svc.Stop(); err != nil {
			s.log.Warn("stop query service", "err", err)
		}
	}
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.cancel()
	s.wg.Wait()
}

// Run starts the service, and stops it when ctx is done.
func (s *Service) Run(ctx context.Context) error {
	if err := s.Start(); err != nil {
		return err
	}
	<-ctx.Done()
	s.Stop()
	return nil
}

// Pending is how many requests are queued, waiting for their min_seq, or
// being answered.
func (s *Service) Pending() int { return int(s.pending.Load()) }

// take is an endpoint's micro handler. It runs on the subscription's
// goroutine, so it only queues the request, or refuses it when too many
// are pending: the subscription never falls behind.
func (s *Service) take(ep *endpoint) func(micro.Request) {
	return func(r micro.Request) {
		reply := r.Reply()
		if reply == "" {
			return // nobody to answer
		}
		if len(r.Data()) > maxRequest {
			s.fail(ep, reply, errorf(CodeBadRequest, "request of %d bytes; at most %d", len(r.Data()), maxRequest))
			return
		}
		if n := s.pending.Add(1); n > int64(s.cfg.MaxPending) {
			s.pending.Add(-1)
			s.stats[ep.name].busy.Add(1)
			s.fail(ep, reply, &Error{Code: CodeUnavailable, Reason: ReasonBusy,
				Message: fmt.Sprintf("busy: %d requests pending on this replica; retry, or add a follower", s.cfg.MaxPending)})
			return
		}
		s.enqueue(&job{ep: ep, reply: reply, data: r.Data()})
	}
}

// enqueue queues j, or answers it 503 once the service is stopping. The
// queue has room for every pending request, so this never blocks.
func (s *Service) enqueue(j *job) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if s.closed {
		s.done(j, stopping())
		return
	}
	s.queue <- j
}

func stopping() *Error {
	return &Error{Code: CodeUnavailable, Reason: ReasonStopping, Message: "stopping: this replica is shutting down; retry"}
}

// work answers queued requests until the service stops, then answers what
// is left in the queue 503.
func (s *Service) work() {
	defer s.wg.Done()
	for {
		select {
		case j := <-s.queue:
			s.answer(j)
		case <-s.ctx.Done():
			for {
				select {
				case j := <-s.queue:
					s.done(j, stopping())
				default:
					return
				}
			}
		}
	}
}

// answer decodes j, waits for its min_seq off the worker if it must, and
// reads its answer from the mirror.
func (s *Service) answer(j *job) {
	if j.req == nil {
		req, err := j.ep.decode(j.data, s)
		if err != nil {
			s.done(j, err)
			return
		}
		j.req = req
	}
	if want := j.req.minSeq(); want > s.pos.Seq() {
		if j.waited {
			s.done(j, s.behind(want))
			return
		}
		j.waited = true
		s.wg.Add(1)
		go s.await(j, want)
		return
	}
	if j.ep.subject == PositionEP {
		// The position is what it asks: learn it from NATS too, since not
		// every message on the stream advances it as it is written (a
		// leader's synchronous publishes, a follower's skipped messages).
		s.refresh()
	}
	seq := s.pos.Seq()
	ctx, cancel := context.WithTimeout(s.ctx, s.cfg.Timeout)
	defer cancel()
	var out answer
	err := s.mirror.ReadMirror(ctx, func(rd *store.MirrorRead) error {
		if !j.ep.anyState {
			if err := s.checkReady(ctx, rd); err != nil {
				return err
			}
		}
		var err error
		out, err = j.req.read(ctx, s, rd)
		return err
	})
	if err != nil {
		switch {
		case s.ctx.Err() != nil:
			err = stopping()
		case errors.Is(err, context.DeadlineExceeded):
			err = &Error{Code: CodeUnavailable, Reason: ReasonTimeout,
				Message: fmt.Sprintf("timeout: reading the answer took more than %s; retry, or ask for less", s.cfg.Timeout)}
		}
		s.done(j, err)
		return
	}
	out.stamp(seq)
	b, err := json.Marshal(out)
	if err != nil {
		s.done(j, fmt.Errorf("encode answer: %w", err))
		return
	}
	if err := s.nc.Publish(j.reply, b); err != nil {
		s.log.Debug("query answer not sent", "endpoint", j.ep.subject, "err", err)
	}
	s.stats[j.ep.name].ok.Add(1)
	s.pending.Add(-1)
}

// await waits for the position to reach want, off the workers, then queues
// j again; after MaxWait it answers 503 behind.
func (s *Service) await(j *job, want uint64) {
	defer s.wg.Done()
	s.refresh()
	if !s.pos.Wait(s.ctx, want, s.cfg.MaxWait) {
		if s.ctx.Err() != nil {
			s.done(j, stopping())
		} else {
			s.done(j, s.behind(want))
		}
		return
	}
	s.enqueue(j)
}

func (s *Service) behind(want uint64) *Error {
	seq := s.pos.Seq()
	return &Error{Code: CodeUnavailable, Reason: ReasonBehind, StreamSeq: seq,
		Message: fmt.Sprintf(
			"behind: this replica's mirror has applied the stream up to %d, not %d, after waiting %s; retry, or ask another replica",
			seq,
			want,
			s.cfg.MaxWait,
		)}
}

// checkReady refuses reads from a mirror without a first complete state.
func (s *Service) checkReady(ctx context.Context, rd *store.MirrorRead) error {
	if s.ready.Load() {
		return nil
	}
	ok, err := rd.Ready(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return &Error{Code: CodeUnavailable, Reason: ReasonNotReady,
			Message: "not ready: this replica's mirror has no complete state yet (the first crawl, or the first events from the stream, are under way)"}
	}
	s.ready.Store(true)
	return nil
}

// done answers j with err (an *Error, or any other as 500) and counts it.
func (s *Service) done(j *job, err error) {
	s.fail(j.ep, j.reply, err)
	s.pending.Add(-1)
}

// fail sends err as a micro error: the code and description in headers,
// the Error as the body.
func (s *Service) fail(ep *endpoint, reply string, err error) {
	var e *Error
	if !errors.As(err, &e) {
		s.log.Warn("query failed", "endpoint", ep.subject, "err", err)
		e = &Error{Code: CodeInternal, Message: "internal error: " + err.Error()}
	}
	if e.StreamSeq == 0 {
		e.StreamSeq = s.pos.Seq()
	}
	s.stats[ep.name].count(e.Code)
	if e.Reason == ReasonBehind {
		s.stats[ep.name].behind.Add(1)
	}
	body, _ := json.Marshal(e)
	msg := &nats.Msg{Subject: reply, Data: body, Header: nats.Header{
		micro.ErrorHeader:     []string{e.Message},
		micro.ErrorCodeHeader: []string{strconv.Itoa(e.Code)},
	}}
	if err := s.nc.PublishMsg(msg); err != nil {
		s.log.Debug("query error not sent", "endpoint", ep.subject, "err", err)
	}
}

// prime learns the position at the start, retrying until it does: until
// the first event, a replica would otherwise answer at 0.
func (s *Service) prime() {
	defer s.wg.Done()
	for {
		err := s.refreshNow()
		if err == nil {
			return
		}
		s.log.Debug("query service: position not known yet", "err", err)
		select {
		case <-s.ctx.Done():
			return
		case <-time.After(time.Second):
		}
	}
}

// refresh learns the position from NATS, unless another request is doing
// so or did within RefreshEvery.
func (s *Service) refresh() {
	if s.cfg.Refresh == nil || time.Since(time.Unix(0, s.lastRefresh.Load())) < s.cfg.RefreshEvery {
		return
	}
	if !s.refreshing.CompareAndSwap(false, true) {
		return
	}
	defer s.refreshing.Store(false)
	if err := s.refreshNow(); err != nil {
		s.log.Debug("query service: position refresh failed", "err", err)
	}
}

func (s *Service) refreshNow() error {
	ctx, cancel := context.WithTimeout(s.ctx, 2*time.Second)
	defer cancel()
	s.lastRefresh.Store(time.Now().UnixNano())
	seq, err := s.cfg.Refresh(ctx)
	if err != nil {
		return err
	}
	s.pos.Advance(seq)
	return nil
}

// endpointStats are an endpoint's counters, in "nats micro stats".
type endpointStats struct {
	ok, badRequest, notFound, unavailable, internal, busy, behind atomic.Int64
}

func (st *endpointStats) count(code int) {
	switch code {
	case CodeBadRequest:
		st.badRequest.Add(1)
	case CodeNotFound:
		st.notFound.Add(1)
	case CodeUnavailable:
		st.unavailable.Add(1)
	default:
		st.internal.Add(1)
	}
}

func (st *endpointStats) snapshot() map[string]int64 {
	return map[string]int64{
		"answered":    st.ok.Load(),
		"bad_request": st.badRequest.Load(),
		"not_found":   st.notFound.Load(),
		"unavailable": st.unavailable.Load(),
		"internal":    st.internal.Load(),
		"busy":        st.busy.Load(),
		"behind":      st.behind.Load(),
	}
}
