package publish

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"github.com/cenkalti/backoff/v4"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Config says where to publish.
type Config struct {
	URL     string // empty: run an embedded server
	Listen  string // embedded server: host:port to accept clients on; empty: in-process only
	DataDir string // embedded server: JetStream storage lives under DataDir/nats

	// Authentication to an external server: at most one of a credentials
	// file, an nkey seed file, a token, or user and password. The
	// embedded server, given a token or a user and password, requires
	// them of every client.
	Credentials string
	NKeySeed    string
	Token       string
	User        string
	Password    string
	// TLS to an external server: CA bundle, client certificate and key.
	TLSCA   string
	TLSCert string
	TLSKey  string
	// ReconnectMaxWait caps the backoff between reconnection attempts;
	// zero means 10s.
	ReconnectMaxWait time.Duration
	// WriteTimeout is how long one write to the server may take before
	// the connection is given up for a new one; zero means
	// DefaultWriteTimeout.
	WriteTimeout time.Duration
	// PingInterval is how often the client pings the server; a connection
	// that leaves MaxPingsOut of them unanswered is stale, and replaced.
	// Zero means DefaultPingInterval.
	PingInterval time.Duration
	// Sync is the embedded server's JetStream sync_interval: when written
	// messages are flushed to disk (see EmbeddedSync).
	Sync EmbeddedSync

	SubjectPrefix   string
	Stream          string
	MaxAge          time.Duration
	DuplicateWindow time.Duration
	Replicas        int
	// CheckStreamOnly is manage_stream = false: the account may not create
	// or update streams, so the stream is only checked to exist and to
	// capture SubjectPrefix.>.
	CheckStreamOnly bool
	// Source is the CloudEvents source attribute of every event.
	Source string
	Logger *slog.Logger
	// FailFast connects once, for callers that report a server that is
	// down (syncd check) rather than wait for it as the daemon does.
	FailFast bool
	// ConnectWait bounds the waits at the start, counted from Dial: for a
	// server that does not answer the first connection, and for JetStream
	// to answer what the start needs of it (Conn.WaitAnswered; syncd sync
	// --once); 0: wait for ever, as the daemon does.
	ConnectWait time.Duration
	// OnAck, when set, is told of every acknowledgement of an asynchronous
	// publish on Conn.JS (the relay's, the snapshots' chunks), from the
	// library's goroutine: it must not block.
	OnAck func(*jetstream.PubAck)
}

// Conn is a NATS connection with JetStream, and the embedded server behind
// it when there is one.
type Conn struct {
	NC     *nats.Conn
	JS     jetstream.JetStream
	Server *server.Server // nil when connected to an external server
	log    *slog.Logger
	closed chan struct{}
	// status is the connection's nats.Status as its handlers last
	// reported it (see Status).
	status atomic.Int32
	// waitUntil is when the waits at the start give up (the connection's
	// and WaitAnswered's, Config.ConnectWait from Dial); zero: never.
	waitUntil time.Time
	// refused is the last permissions violation the server reported on
	// the connection, and when (see WaitAnswered).
	refused atomic.Pointer[refusal]
}

// refusesJetStream reports whether a permissions violation is of a
// JetStream subject (its API, a KV bucket's or an object store's keys):
// what a request of Conn.WaitAnswered publishes. Another (a request for
// the user's account, a subscription) does not end its wait.
func refusesJetStream(err error) bool {
	msg := err.Error()
	for _, prefix := range []string{`Publish to "$JS.`, `Publish to "$KV.`, `Publish to "$O.`} {
		if strings.Contains(msg, prefix) {
			return true
		}
	}
	return false
}

// refusal is a permissions violation and when the server reported it.
type refusal struct {
	err error
	at  time.Time
}

// Status is the connection's state (nats.CONNECTED, RECONNECTING,
// CLOSED) as the client's handlers last reported it. Unlike the client's
// own Status and IsConnected, it never waits on the connection's lock,
// which a write to a server that stopped reading holds until the write
// times out (WriteTimeout, 15 s): a readiness probe or a metrics scrape
// must not wait that long.
func (c *Conn) Status() nats.Status { return nats.Status(c.status.Load()) }

// setStatus records s, unless the connection is closed for good.
func (c *Conn) setStatus(s nats.Status) {
	for {
		old := c.status.Load()
		if old == int32(nats.CLOSED) || c.status.CompareAndSwap(old, int32(s)) {
			return
		}
	}
}

// Connect is Dial, then making sure the stream exists: EnsureStream, or
// CheckStream when cfg.CheckStreamOnly.
func Connect(ctx context.Context, cfg Config) (*Conn, error) {
	c, err := Dial(ctx, cfg)
	if err != nil {
		return nil, err
	}
	what := "create or update the stream"
	if cfg.CheckStreamOnly {
		what = "look up the stream"
	}
	err = c.WaitAnswered(ctx, what, func(ctx context.Context) error {
		if cfg.CheckStreamOnly {
			return CheckStream(ctx, c.JS, cfg)
		}
		return EnsureStream(ctx, c.JS, cfg)
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// Dial starts the embedded server when cfg.URL is empty and connects, with
// no regard to the stream. Once connected, the connection reconnects
// forever with backoff, logging each state change; the initial connection
// does not retry, so that a wrong address or credentials fail at start.
func Dial(ctx context.Context, cfg Config) (*Conn, error) {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	c := &Conn{log: log, closed: make(chan struct{})}
	if cfg.ConnectWait > 0 {
		c.waitUntil = time.Now().Add(cfg.ConnectWait)
	}
	c.status.Store(int32(nats.CONNECTING))
	opts, err := connOptions(cfg, log, c)
	if err != nil {
		return nil, err
	}
	url := cfg.URL
	if url == "" {
		ns, err := StartEmbedded(cfg, log.With("part", "nats-server"))
		if err != nil {
			return nil, err
		}
		c.Server = ns
		opts = append(opts, nats.InProcessServer(ns))
		if cfg.Listen != "" {
			log.Info("embedded NATS listening", "url", ns.ClientURL())
		}
	}
	var nc *nats.Conn
	if cfg.FailFast {
		nc, err = nats.Connect(url, opts...)
	} else {
		nc, err = connectWaiting(ctx, url, opts, c.waitUntil, log)
	}
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("connect to NATS at %s: %w", RedactURL(url), err)
	}
	c.NC = nc
	// Unless a handler reported a change meanwhile.
	c.status.CompareAndSwap(int32(nats.CONNECTING), int32(nats.CONNECTED))
	log.Info("NATS connected", "server", RedactURL(nc.ConnectedUrl()), "embedded", c.Server != nil)
	// The library's own limit on pending acks sits above the relay's
	// in-flight limit, so the relay's bound is the one that holds; the ack
	// timeout frees the relay from an acknowledgement lost without a
	// disconnection (a disconnection fails every pending publish at once).
	jsOpts := []jetstream.JetStreamOpt{
		jetstream.WithPublishAsyncMaxPending(2 * DefaultMaxInFlight),
		jetstream.WithPublishAsyncTimeout(30 * time.Second),
	}
	if cfg.OnAck != nil {
		jsOpts = append(
			jsOpts,
			jetstream.WithPublishAsyncAckHandler(
				func(_ jetstream.JetStream, _ *nats.Msg, ack *jetstream.PubAck) { cfg.OnAck(ack) },
			),
		)
	}
	js, err := jetstream.New(nc, jsOpts...)
	if err != nil {
		c.Close()
		return nil, fmt.Errorf("JetStream context: %w", err)
	}
	c.JS = js
	return c, nil
}

// DefaultWriteTimeout is Config.WriteTimeout's default. nats.go writes
// what it buffered (up to 32 KiB) and the message being published in one
// write, and the largest message syncd publishes is a snapshot's chunk
// (512 KiB): a link that carries less than about 40 KB/s to the server
// times such writes out, and cannot carry snapshots.
const DefaultWriteTimeout = 15 * time.Second

// DefaultPingInterval and maxPingsOut find a connection that answers
// nothing stale within about 30 s.
const (
	DefaultPingInterval = 10 * time.Second
	maxPingsOut         = 3
)

// connOptions are the nats.Options of cfg: identity, authentication, TLS,
// and reconnecting forever with logged state changes. closed is closed when
// the connection is.
func connOptions(cfg Config, log *slog.Logger, c *Conn) ([]nats.Option, error) {
	maxWait := cfg.ReconnectMaxWait
	if maxWait <= 0 {
		maxWait = 10 * time.Second
	}
	writeTimeout, pingInterval := cfg.WriteTimeout, cfg.PingInterval
	if writeTimeout <= 0 {
		writeTimeout = DefaultWriteTimeout
	}
	if pingInterval <= 0 {
		pingInterval = DefaultPingInterval
	}
	opts := []nats.Option{
		nats.Name("syncd"),
		// nats.go writes to the server holding the connection's lock, for
		// up to FlusherTimeout (a minute by default) when the network
		// stops taking bytes (a peer that drops every packet): every call
		// on the connection waits on the lock meanwhile, whatever its
		// context. The write is bounded, and a connection whose write
		// timed out is replaced (what it buffered is lost: the outbox
		// publishes it again, and the stream drops duplicates by id).
		nats.FlusherTimeout(writeTimeout),
		nats.ReconnectOnFlusherError(),
		// A connection that writes little (a standby's lease reads, a
		// follower's fetches) never fills the socket's buffer: pings find
		// it stale (nats.go's default, every 2 minutes, took 4 to 6).
		nats.PingInterval(pingInterval),
		nats.MaxPingsOutstanding(maxPingsOut),
		nats.MaxReconnects(-1),
		// nats.go closes the connection for good when a reconnection meets
		// the same authorization error twice (credentials revoked, or a
		// server restarted before its accounts were loaded): the process
		// would stay up with no lease, relay or follower. It keeps trying
		// instead, each failure logged (ErrorHandler), and reconnects once
		// the server accepts the credentials again.
		nats.IgnoreAuthErrorAbort(),
		nats.CustomReconnectDelay(func(attempts int) time.Duration { return reconnectDelay(attempts, maxWait) }),
		nats.ReconnectBufSize(-1), // never buffer publishes while disconnected: the outbox is the buffer
		// Errors the library reports are its own (connection refused, TLS,
		// authorization violation) and never contain credentials; URLs are
		// logged through RedactURL, since the library's own redaction keeps
		// a token given as the URL's user part.
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			c.setStatus(nats.RECONNECTING)
			if err != nil {
				log.Warn("NATS disconnected; reconnecting", "err", err)
			} else {
				log.Info("NATS disconnected")
			}
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) { log.Debug("NATS reconnection attempt failed", "err", err) }),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			c.setStatus(nats.CONNECTED)
			log.Info("NATS reconnected", "server", RedactURL(nc.ConnectedUrl()))
		}),
		nats.ClosedHandler(func(nc *nats.Conn) {
			c.status.Store(int32(nats.CLOSED))
			if err := nc.LastError(); err != nil {
				log.Warn("NATS connection closed", "err", err)
			} else {
				log.Info("NATS connection closed")
			}
			close(c.closed)
		}),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			subject := ""
			if sub != nil {
				subject = sub.Subject
			}
			if errors.Is(err, nats.ErrPermissionViolation) && refusesJetStream(err) {
				c.refused.Store(&refusal{err, time.Now()})
			}
			log.Warn("NATS asynchronous error", "subscription", subject, "err", err)
		}),
	}
	switch {
	case cfg.Credentials != "":
		opts = append(opts, nats.UserCredentials(cfg.Credentials))
	case cfg.NKeySeed != "":
		o, err := nats.NkeyOptionFromSeed(cfg.NKeySeed)
		if err != nil {
			return nil, fmt.Errorf("read nats.nkey_seed %s: %w", cfg.NKeySeed, err)
		}
		opts = append(opts, o)
	case cfg.Token != "":
		opts = append(opts, nats.Token(cfg.Token))
	case cfg.User != "":
		opts = append(opts, nats.UserInfo(cfg.User, cfg.Password))
	}
	if cfg.TLSCA != "" {
		opts = append(opts, nats.RootCAs(cfg.TLSCA))
	}
	if cfg.TLSCert != "" || cfg.TLSKey != "" {
		opts = append(opts, nats.ClientCert(cfg.TLSCert, cfg.TLSKey))
	}
	return opts, nil
}

// reconnectDelay is the wait before reconnection attempt n (0-based, as
// the library counts per server): exponential from 250ms up to maxWait, with
// up to 25% jitter so that many syncd instances do not return in lockstep.
func reconnectDelay(attempts int, maxWait time.Duration) time.Duration {
	d := maxWait
	if attempts < 16 {
		d = min(250*time.Millisecond<<attempts, maxWait)
	}
	return d + rand.N(d/4+1)
}

// RedactURL hides credentials in a comma-separated list of NATS URLs: a
// password, or a lone user part, which NATS reads as a token.
func RedactURL(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		u, err := url.Parse(strings.TrimSpace(p))
		if err != nil {
			if strings.Contains(p, "@") {
				parts[i] = "(unparsable URL with credentials)"
			}
			continue
		}
		if u.User == nil {
			continue
		}
		if _, hasPassword := u.User.Password(); hasPassword {
			u.User = url.UserPassword(u.User.Username(), "xxxxx")
		} else {
			u.User = url.User("xxxxx")
		}
		parts[i] = u.String()
	}
	return strings.Join(parts, ",")
}

// EmbeddedSync is when the embedded server's JetStream flushes what it
// stored to disk: its sync_interval. The zero value is syncd's default, a
// background fsync every second (DefaultSyncInterval); see docs/cluster.md,
// "Durability", for the choice and its measured cost.
type EmbeddedSync struct {
	// Always has every message on disk before JetStream acknowledges it
	// (sync_interval "always").
	Always bool
	// Interval is the time between background fsyncs when not Always;
	// zero: DefaultSyncInterval. Until its next fsync, what the server
	// acknowledged survives a crash of the process but not of the OS or
	// the machine.
	Interval time.Duration
}

// DefaultSyncInterval is the embedded server's sync_interval unless
// configured: JetStream's own default is 2 minutes.
const DefaultSyncInterval = time.Second

// ParseSync reads a sync_interval as NATS writes it: "always", or a
// duration.
func ParseSync(v string) (EmbeddedSync, error) {
	if strings.EqualFold(v, "always") {
		return EmbeddedSync{Always: true}, nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return EmbeddedSync{}, fmt.Errorf("want \"always\" or a positive duration such as \"1s\" or \"2m\", got %q", v)
	}
	return EmbeddedSync{Interval: d}, nil
}

// String is the setting as NATS writes it.
func (s EmbeddedSync) String() string {
	if s.Always {
		return "always"
	}
	return s.interval().String()
}

func (s EmbeddedSync) interval() time.Duration {
	if s.Interval > 0 {
		return s.Interval
	}
	return DefaultSyncInterval
}

// StartEmbedded starts a NATS server with JetStream storing under
// cfg.DataDir/nats. With cfg.Listen empty it accepts in-process
// connections only. With cfg.Token, or cfg.User and cfg.Password, every
// client must present them (syncd's own connection does, see connOptions);
// without, it refuses to listen beyond loopback, where an anonymous client
// could delete the stream. The server's warnings and errors go to log
// (its notices at debug): a damaged store ("could not locate msg block")
// must not pass unseen. cfg.Sync says when it flushes to disk.
func StartEmbedded(cfg Config, log *slog.Logger) (*server.Server, error) {
	opts := &server.Options{
		ServerName:    "syncd",
		JetStream:     true,
		StoreDir:      filepath.Join(cfg.DataDir, "nats"),
		NoSigs:        true,
		Authorization: cfg.Token,
		Username:      cfg.User,
		Password:      cfg.Password,
		SyncAlways:    cfg.Sync.Always,
		SyncInterval:  cfg.Sync.interval(),
	}
	if err := listenOptions(opts, cfg.Listen); err != nil {
		return nil, err
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("embedded NATS: %w", err)
	}
	ns.SetLogger(serverLog{log}, false, false)
	go ns.Start()
	if !ns.ReadyForConnections(15 * time.Second) {
		ns.Shutdown()
		return nil, errors.New("embedded NATS did not become ready in 15s (is the listen address in use?)")
	}
	return ns, nil
}

// listenOptions sets where opts listens: nowhere when listen is empty, and
// beyond loopback only when opts holds credentials.
func listenOptions(opts *server.Options, listen string) error {
	if listen == "" {
		opts.DontListen = true
		return nil
	}
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return fmt.Errorf("nats listen %q: %w", listen, err)
	}
	p, err := strconv.Atoi(port)
	if err != nil {
		return fmt.Errorf("nats listen %q: bad port", listen)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) && opts.Authorization == "" &&
		opts.Username == "" {
		return fmt.Errorf(
			"nats listen %s: the embedded NATS server takes clients beyond loopback only with credentials (a token, or a user and password)",
			listen,
		)
	}
	opts.Host, opts.Port = host, p
	if p == 0 {
		opts.Port = server.RANDOM_PORT
	}
	return nil
}

// EnsureStream creates the stream or updates it to cfg.
func EnsureStream(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	_, err := ensureStream(ctx, js, cfg)
	return err
}

// ensureStream is EnsureStream, returning the stream.
func ensureStream(ctx context.Context, js jetstream.JetStream, cfg Config) (jetstream.Stream, error) {
	sc := jetstream.StreamConfig{
		Name:        cfg.Stream,
		Description: "syncd change events",
		Subjects:    []string{cfg.SubjectPrefix + ".>"},
		Storage:     jetstream.FileStorage,
		MaxAge:      cfg.MaxAge,
		Duplicates:  cfg.DuplicateWindow,
		Replicas:    max(cfg.Replicas, 1),
	}
	s, err := js.CreateOrUpdateStream(ctx, sc)
	if err != nil {
		return nil, fmt.Errorf("create or update stream %s: %w", cfg.Stream, err)
	}
	return s, nil
}

// ErrStreamNotFound is returned (wrapped) by Connect and CheckStream when
// syncd may not manage the stream and it does not exist.
var ErrStreamNotFound = errors.New("stream not found")

// CheckStream checks, without changing anything, that cfg.Stream exists and
// captures the subjects syncd publishes on: what manage_stream = false asks
// for. Its errors name the stream and the NATS account, since the usual
// cause is a stream created in another account or not created yet.
func CheckStream(ctx context.Context, js jetstream.JetStream, cfg Config) error {
	s, err := js.Stream(ctx, cfg.Stream)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return fmt.Errorf(
			"%w: stream %q does not exist in NATS account %s, and nats.manage_stream = false forbids syncd to create it: "+
				"create it with subjects %q (e.g. nats stream add %s --subjects '%s.>') or set manage_stream = true",
			ErrStreamNotFound,
			cfg.Stream,
			accountName(ctx, js.Conn()),
			cfg.SubjectPrefix+".>",
			cfg.Stream,
			cfg.SubjectPrefix,
		)
	}
	if Unanswered(ctx, err) {
		// Asking for the account would go unanswered too (and to a user
		// who may not ask it, be refused: see Conn.WaitAnswered).
		return fmt.Errorf("look up stream %q: %w", cfg.Stream, err)
	}
	if err != nil {
		return fmt.Errorf("look up stream %q in NATS account %s: %w", cfg.Stream, accountName(ctx, js.Conn()), err)
	}
	subjects := s.CachedInfo().Config.Subjects
	for _, pattern := range subjects {
		if covers(pattern, cfg.SubjectPrefix+".>") {
			return nil
		}
	}
	return fmt.Errorf(
		"stream %q in NATS account %s does not capture %q (its subjects are %q): "+
			"add the subject to the stream or change nats.subject_prefix",
		cfg.Stream,
		accountName(ctx, js.Conn()),
		cfg.SubjectPrefix+".>",
		subjects,
	)
}

// accountName asks the server which account the connection is bound to, for
// error messages; it says so when the server does not tell.
func accountName(ctx context.Context, nc *nats.Conn) string {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	m, err := nc.RequestWithContext(ctx, "$SYS.REQ.USER.INFO", nil)
	if err != nil {
		return fmt.Sprintf("(unknown: user info request: %v)", err)
	}
	var resp struct {
		Data struct {
			Account     string `json:"account"`
			AccountName string `json:"account_name"`
		} `json:"data"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil || resp.Data.Account == "" {
		return "(unknown: the server did not say)"
	}
	if n := resp.Data.AccountName; n != "" && n != resp.Data.Account {
		return fmt.Sprintf("%q (%s)", n, resp.Data.Account)
	}
	return fmt.Sprintf("%q", resp.Data.Account)
}

// covers reports whether a stream subject pattern captures every subject
// matching filter, which ends in ">": token by token the pattern is equal or
// "*", until a ">" in the pattern takes the rest.
func covers(pattern, filter string) bool {
	pt, ft := strings.Split(pattern, "."), strings.Split(filter, ".")
	for i, p := range pt {
		if p == ">" {
			return true
		}
		if i >= len(ft) || ft[i] == ">" || (p != "*" && p != ft[i]) {
			return false
		}
	}
	return false
}

// Close drains the connection and stops the embedded server.
func (c *Conn) Close() {
	if c.NC != nil {
		if err := c.NC.Drain(); err != nil {
			c.log.Warn("drain NATS connection", "err", err)
		}
		select {
		case <-c.closed:
		case <-time.After(5 * time.Second):
			c.log.Warn("NATS connection did not drain in 5s; closing it")
			c.NC.Close()
		}
	}
	if c.Server != nil {
		c.Server.Shutdown()
		c.Server.WaitForShutdown()
	}
}

// serverLog hands the embedded NATS server's log lines to slog.
type serverLog struct{ log *slog.Logger }

func (l serverLog) Noticef(format string, v ...any) { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l serverLog) Warnf(format string, v ...any)   { l.log.Warn(fmt.Sprintf(format, v...)) }
func (l serverLog) Errorf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLog) Fatalf(format string, v ...any)  { l.log.Error(fmt.Sprintf(format, v...)) }
func (l serverLog) Debugf(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }
func (l serverLog) Tracef(format string, v ...any)  { l.log.Debug(fmt.Sprintf(format, v...)) }

// WaitAnswered calls try, a JetStream request on c that syncd cannot
// start without, until it succeeds or fails otherwise than for want of an
// answer (Unanswered): a request that went unanswered, or that JetStream
// refused as unavailable for the moment, is tried again with backoff and a
// warning per try, as connectWaiting waits for a server: a cluster that is
// electing its leaders, or has lost a route, answers again shortly, and is
// not a reason to exit. A request the server refused to carry
// (a permissions violation, which the client learns of apart from the
// request, and which leaves the request unanswered) ends the wait with
// that refusal. With Config.ConnectWait set, it gives up once that much
// has passed since Dial: the connection's wait and every WaitAnswered on
// it share the one bound. what names the request in the warning.
func (c *Conn) WaitAnswered(ctx context.Context, what string, try func(context.Context) error) error {
	return retryAtStart(ctx, c.waitUntil, func(attempt int) (bool, error) {
		limit := answerWait
		if !c.waitUntil.IsZero() {
			limit = min(limit, max(time.Until(c.waitUntil), time.Millisecond))
		}
		began := time.Now()
		err := tryFor(ctx, limit, try)
		switch {
		case err == nil:
			if attempt > 1 {
				c.log.Info("JetStream answered after waiting", "request", what, "attempts", attempt)
			}
			return false, nil
		case !Unanswered(ctx, err):
			return false, err
		}
		if r := c.refused.Load(); r != nil && !r.at.Before(began) {
			return false, fmt.Errorf("%s: NATS refused the request: %w", what, r.err)
		}
		return true, err
	}, func(attempt int, wait time.Duration, err error) {
		c.log.Warn("JetStream did not answer; trying again", "request", what, "attempt", attempt,
			"next_try_in", wait.Round(time.Millisecond).String(), "err", err)
	})
}

// retryAtStart is the waiting of syncd's start (connectWaiting,
// Conn.WaitAnswered): it calls try until try says not to try again, and
// returns try's error then; between tries it waits with backoff, telling
// warn of each wait. It gives up, with try's last error, when ctx ends or
// before a wait would end past giveUp (zero: never).
func retryAtStart(
	ctx context.Context,
	giveUp time.Time,
	try func(attempt int) (again bool, err error),
	warn func(attempt int, wait time.Duration, err error),
) error {
	b := backoff.NewExponentialBackOff(
		backoff.WithInitialInterval(250*time.Millisecond),
		backoff.WithMaxInterval(15*time.Second),
		backoff.WithMaxElapsedTime(0),
	)
	for attempt := 1; ; attempt++ {
		again, err := try(attempt)
		if !again {
			return err
		}
		wait := b.NextBackOff()
		if !giveUp.IsZero() && time.Now().Add(wait).After(giveUp) {
			return fmt.Errorf("giving up after %d attempts: %w", attempt, err)
		}
		warn(attempt, wait, err)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (gave up waiting: %w)", err, ctx.Err())
		case <-t.C:
		}
	}
}

// answerWait bounds each try of Conn.WaitAnswered, as the client bounds a
// request made without a deadline: a request whose answer was lost (sent
// while the cluster elected a leader) is otherwise waited for as long as
// the caller's context lasts.
const answerWait = 5 * time.Second

// tryFor calls try with ctx bounded by d.
func tryFor(ctx context.Context, d time.Duration, try func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	return try(ctx)
}

// JetStream's error codes for a request it cannot answer for the moment:
// "JetStream system temporarily unavailable" (a cluster without a meta
// leader), "incomplete results", and "no suitable peers for placement"
// (a cluster whose nodes have not all joined its meta group yet, as at the
// cluster's own start, or with too few of them up for the stream's
// replicas: make cluster-test's replicas, started as the cluster formed,
// exited with it).
const (
	jsErrCodeClusterNotAvail   jetstream.ErrorCode = 10008
	jsErrCodeClusterIncomplete jetstream.ErrorCode = 10004
	jsErrCodeClusterNoPeers    jetstream.ErrorCode = 10005
)

// Unanswered reports whether err, from a JetStream request made under ctx,
// is the want of an answer rather than an answer: the request timed out
// (its own deadline, not ctx's, which is still alive), or JetStream said
// it cannot answer for the moment, or the client refused it while it
// reconnects. Such a request may be tried again; a refusal (permissions,
// a conflicting stream, JetStream not enabled) is an answer.
func Unanswered(ctx context.Context, err error) bool {
	if ctx.Err() != nil {
		return false
	}
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		return true
	}
	// The server went away meanwhile (a node restarting): the client
	// buffers nothing while it reconnects (ReconnectBufSize -1), and
	// refuses the request at once.
	if errors.Is(err, nats.ErrReconnectBufExceeded) || errors.Is(err, nats.ErrConnectionReconnecting) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == jsErrCodeClusterNotAvail || apiErr.ErrorCode == jsErrCodeClusterIncomplete ||
			apiErr.ErrorCode == jsErrCodeClusterNoPeers)
}

// connectWaiting connects to url, waiting with backoff (and a warning per
// try) while no server answers, as syncd does once connected: a NATS
// server that starts after syncd, or is restarting, is waited for, not a
// reason to exit; until giveUp when it is set, then it gives up as the
// platform client does. Other failures (credentials, TLS) are returned at
// once.
func connectWaiting(
	ctx context.Context,
	url string,
	opts []nats.Option,
	giveUp time.Time,
	log *slog.Logger,
) (*nats.Conn, error) {
	var nc *nats.Conn
	err := retryAtStart(ctx, giveUp, func(attempt int) (bool, error) {
		var err error
		if nc, err = nats.Connect(url, opts...); err == nil && attempt > 1 {
			log.Info("NATS reachable after waiting", "attempts", attempt)
		}
		return errors.Is(err, nats.ErrNoServers), err
	}, func(attempt int, wait time.Duration, err error) {
		log.Warn("NATS not reachable; waiting for it", "url", RedactURL(url), "attempt", attempt,
			"next_try_in", wait.Round(time.Millisecond).String(), "err", err)
	})
	if err != nil {
		return nil, err
	}
	return nc, nil
}
