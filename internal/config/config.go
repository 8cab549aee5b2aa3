package config

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"time"
)

// Config is the whole of syncd's configuration. The toml tags are the
// contract documented in config.example.toml.
type Config struct {
	Platform Platform `toml:"platform"`
	Crawl    Crawl    `toml:"crawl"`
	Events   Events   `toml:"events"`
	NATS     NATS     `toml:"nats"`
	Store    Store    `toml:"store"`
	Admin    Admin    `toml:"admin"`
	Log      Log      `toml:"log"`
	Cluster  Cluster  `toml:"cluster"`
	KV       KV       `toml:"kv"`
	Snapshot Snapshot `toml:"snapshot"`
	Verify   Verify   `toml:"verify"`
	Sync     Sync     `toml:"sync"`
	Query    Query    `toml:"query"`
	Maturity Maturity `toml:"maturity"`
}

// Maturity configures tags that mature: for each age, the leader keeps
// every tag's matured digest (the one the tag pointed to that long ago) in
// the [kv] matured bucket and announces each change as tag.matured.
type Maturity struct {
	// After are the ages, Go durations of whole seconds ("72h"); empty:
	// off. Strings, not Durations, so that SYNCD_MATURITY_AFTER sets them
	// as any other list.
	After []string `toml:"after"`
}

// Verify configures how the replicas and the stream are checked against
// the leader's mirror.
type Verify struct {
	// CheckpointEvery is the time between two checkpoints the leader puts
	// on the stream, for followers and standbys to compare their mirrors at.
	CheckpointEvery Duration `toml:"checkpoint_every"`
	// AuditEvery is the time between two audits of the stream by the
	// leader: every event its mirror marks published must be on the stream,
	// and is published again, under the same id, when it is not.
	AuditEvery Duration `toml:"audit_every"`
	// SweepEvery is the time between two sweeps: audits that check the
	// whole event log again from its start, for messages the stream lost
	// after an audit had found them there (a lost head, which the
	// stream's state cannot tell from its limits' work). Losses its state
	// shows (the stream created again, its tail gone, messages gone
	// between its first and last) start a sweep at the next audit.
	SweepEvery Duration `toml:"sweep_every"`
}

// Query configures the query service every replica runs on NATS (a NATS
// micro service): questions answered from the replica's own mirror.
type Query struct {
	Enabled bool `toml:"enabled"`
	// Prefix begins the request subjects (<prefix>.tag.at, …); it must lie
	// outside the stream's <nats.subject_prefix>.>.
	Prefix string `toml:"prefix"`
	// MaxWait bounds the wait for a request's min_seq.
	MaxWait Duration `toml:"max_wait"`
	// MaxLimit caps the records, tags, intervals or advisories of one answer.
	MaxLimit int `toml:"max_limit"`
	// Concurrency is how many requests are read from the mirror at once.
	Concurrency int `toml:"concurrency"`
	// MaxPending is how many requests may wait their turn; more are refused.
	MaxPending int `toml:"max_pending"`
}

// KV configures the key-value buckets of current state that the leader
// keeps beside the stream: tags, repos and advisories.
type KV struct {
	Enabled    bool   `toml:"enabled"`
	Tags       string `toml:"tags_bucket"`
	Repos      string `toml:"repos_bucket"`
	Advisories string `toml:"advisories_bucket"`
	// Matured is the bucket of matured digests ([maturity]):
	// <repo path>.<tag>.<age>.
	Matured string `toml:"matured_bucket"`
	// History is how many values each key keeps (1 to 64).
	History int `toml:"history"`
	// Replicas of each bucket; 0: nats.replicas.
	Replicas int `toml:"replicas"`
	// ReconcileInterval is how often the buckets are reconciled with the
	// mirror beside the reconciliations at start and after failures; 0:
	// never.
	ReconcileInterval Duration `toml:"reconcile_interval"`
}

// BucketReplicas is the buckets' replicas: replicas, or nats.replicas
// when it is 0.
func (c Config) BucketReplicas() int {
	if c.KV.Replicas > 0 {
		return c.KV.Replicas
	}
	return c.NATS.Replicas
}

// Snapshot configures the snapshots of the mirror that the leader writes
// to a JetStream Object Store bucket, from which a follower or standby
// with an empty mirror starts instead of the whole event stream.
type Snapshot struct {
	// Enabled has the leader write snapshots; restoring from the bucket
	// does not depend on it.
	Enabled bool `toml:"enabled"`
	// Every is the time between two snapshots; the first is written when
	// the baseline has ended.
	Every Duration `toml:"every"`
	// Keep is how many snapshots the bucket keeps; older ones are deleted.
	Keep int `toml:"keep"`
	// Bucket is the Object Store bucket; its replicas are [nats] replicas.
	Bucket string `toml:"bucket"`
}

// Cluster configures high availability: replicas of "syncd run" that share
// a leader lease in a NATS KV bucket, and the durable consumer through which
// standbys and "syncd follow" mirror the event stream.
type Cluster struct {
	Enabled bool `toml:"enabled"`
	// NodeID names this replica in the lease; empty: hostname-pid.
	NodeID   string   `toml:"node_id"`
	Bucket   string   `toml:"bucket"`
	Key      string   `toml:"key"`
	LeaseTTL Duration `toml:"lease_ttl"`
	// Consumer is the durable consumer's name; empty: syncd-follow-<node_id>.
	Consumer string `toml:"consumer"`
	// SigningKeyFile is the leader's key (an nkey seed or a PEM Ed25519
	// private key, mode 0600): it signs every message it puts on the
	// stream. Empty: messages go unsigned.
	SigningKeyFile string `toml:"signing_key_file"`
	// VerifyKeys are the nkey public keys whose signatures followers and
	// standbys accept; a message signed by none of them is rejected.
	// Empty: the signing key's own, or without one, every message is
	// taken.
	VerifyKeys []string `toml:"verify_keys"`
}

// Admin configures the operations listener: metrics, liveness, readiness.
type Admin struct {
	Listen      string  `toml:"listen"`
	StaleFactor float64 `toml:"stale_factor"`
}

// Platform says where the upstream API and registry are and how to
// authenticate to them.
type Platform struct {
	BaseURL     string `toml:"base_url"`
	RegistryURL string `toml:"registry_url"`
	// Token, TokenFile and TokenCommand give the platform API credential
	// (its audience is the API).
	Token        string `toml:"token"`
	TokenFile    string `toml:"token_file"`
	TokenCommand string `toml:"token_command"`
	// RegistryToken, RegistryTokenFile, RegistryTokenCommand and
	// RegistryCredentialHelper give the registry credential (its audience
	// is the registry host), which the tag history API wants.
	RegistryToken            string `toml:"registry_token"`
	RegistryTokenFile        string `toml:"registry_token_file"`
	RegistryTokenCommand     string `toml:"registry_token_command"`
	RegistryCredentialHelper string `toml:"registry_credential_helper"`
	// Identity, with IdentityTokenFile, makes syncd assume that identity by
	// exchanging the external OIDC token at STSURL, once per audience.
	Identity          string `toml:"identity"`
	IdentityTokenFile string `toml:"identity_token_file"`
	STSURL            string `toml:"sts_url"`
	// APIAudience and RegistryAudience are the audiences asked for in an
	// exchange and named in errors; empty: the base URL, the registry host.
	APIAudience      string `toml:"api_audience"`
	RegistryAudience string `toml:"registry_audience"`
	// AllowInsecureHTTP permits http:// to a host other than loopback for
	// base_url, registry_url, sts_url and [events] issuer, where tokens
	// and the keys that verify pushed events travel.
	AllowInsecureHTTP bool `toml:"allow_insecure_http"`

	Group        string   `toml:"group"`
	Organization string   `toml:"organization"`
	Vendor       string   `toml:"vendor"`
	PublicOrg    string   `toml:"public_org"`
	Timeout      Duration `toml:"timeout"`
}

// Crawl controls the scheduled crawl.
type Crawl struct {
	Schedule           string `toml:"schedule"`
	SweepSchedule      string `toml:"sweep_schedule"`
	AdvisoriesSchedule string `toml:"advisories_schedule"`
	// SubscriptionsSchedule reconciles the event subscription ([events] sink_url).
	SubscriptionsSchedule string   `toml:"subscriptions_schedule"`
	Jitter                Duration `toml:"jitter"`
	Concurrency           int      `toml:"concurrency"`
	RequestsPerSecond     float64  `toml:"requests_per_second"`
	Include               []string `toml:"include"`
	Exclude               []string `toml:"exclude"`
	PublicImages          []string `toml:"public_images"`
	// TagFamilies are the tag families the v2 tag list hides unless asked:
	// "dates" (*-20yymmdd), "epochs" (*-r<N>), "referrers" (sha256-*).
	TagFamilies []string `toml:"tag_families"`
	// UpdatedSinceMargin is how far before the newest tag update the
	// mirror holds the incremental crawl asks for changes from.
	UpdatedSinceMargin Duration `toml:"updated_since_margin"`
}

// Events configures the receiver of the platform's pushed events.
type Events struct {
	Listen     string `toml:"listen"`
	SinkURL    string `toml:"sink_url"`
	Issuer     string `toml:"issuer"`
	Audience   string `toml:"audience"`
	TypePrefix string `toml:"type_prefix"`
	MaxBody    int64  `toml:"max_body"`
	QueueSize  int    `toml:"queue_size"`
}

// NATS says where events are published and how to authenticate there.
type NATS struct {
	URL             string   `toml:"url"`
	Listen          string   `toml:"listen"`
	SubjectPrefix   string   `toml:"subject_prefix"`
	Stream          string   `toml:"stream"`
	MaxAge          Duration `toml:"max_age"`
	DuplicateWindow Duration `toml:"duplicate_window"`
	Replicas        int      `toml:"replicas"`
	ManageStream    bool     `toml:"manage_stream"`
	// SyncInterval is the embedded server's JetStream sync_interval:
	// "always" or a duration (see publish.ParseSync); unused with url.
	SyncInterval string `toml:"sync_interval"`

	// ListenPublic lets the embedded server listen beyond loopback, where
	// it then requires Token, or User and Password, of every client.
	ListenPublic bool `toml:"listen_public"`

	// Authentication to an external server: at most one of a credentials
	// file, an nkey seed file, a token, or user and password.
	Credentials string `toml:"credentials"`
	NKeySeed    string `toml:"nkey_seed"`
	Token       string `toml:"token"`
	User        string `toml:"user"`
	Password    string `toml:"password"`
	// TLS to an external server: a CA bundle to trust, and a client
	// certificate with its key for servers that verify clients.
	TLSCA   string `toml:"tls_ca"`
	TLSCert string `toml:"tls_cert"`
	TLSKey  string `toml:"tls_key"`
}

// Store configures the SQLite mirror.
type Store struct {
	Path           string   `toml:"path"`
	EventRetention Duration `toml:"event_retention"`
	InitialEvents  string   `toml:"initial_events"`
}

// Log configures logging.
type Log struct {
	Level  string `toml:"level"`
	Format string `toml:"format"`
}

// Duration is a time.Duration written as a Go duration string ("90s", "72h").
type Duration struct{ time.Duration }

// UnmarshalText implements encoding.TextUnmarshaler.
func (d *Duration) UnmarshalText(b []byte) error {
	v, err := time.ParseDuration(string(b))
	if err != nil {
		return fmt.Errorf("not a duration (want e.g. \"30s\", \"72h\"): %q", b)
	}
	d.Duration = v
	return nil
}

// MarshalText implements encoding.TextMarshaler.
func (d Duration) MarshalText() ([]byte, error) { return []byte(d.Duration.String()), nil }

// Default returns the configuration used when a key is not set anywhere.
func Default() Config {
	return Config{
		Platform: Platform{
			Vendor:    "chainguard",
			PublicOrg: "chainguard",
			STSURL:    DefaultSTSURL,
			Timeout:   Duration{30 * time.Second},
		},
		Crawl: Crawl{
			Schedule:              "@every 15m",
			SweepSchedule:         "@every 6h",
			AdvisoriesSchedule:    "@every 1h",
			SubscriptionsSchedule: "@every 10m",
			Jitter:                Duration{10 * time.Second},
			Concurrency:           4,
			RequestsPerSecond:     20,
			TagFamilies:           []string{"dates", "epochs"},
			UpdatedSinceMargin:    Duration{2 * time.Minute},
		},
		Events: Events{
			Audience:  "customer",
			MaxBody:   1 << 20,
			QueueSize: 1024,
		},
		NATS: NATS{
			SubjectPrefix:   "syncd",
			Stream:          "SYNCD",
			MaxAge:          Duration{7 * 24 * time.Hour},
			DuplicateWindow: Duration{2 * time.Hour},
			Replicas:        1,
			ManageStream:    true,
			SyncInterval:    "1s",
		},
		Store: Store{
			Path:           "data/syncd.db",
			EventRetention: Duration{30 * 24 * time.Hour},
			InitialEvents:  "none",
		},
		Admin: Admin{Listen: "127.0.0.1:8466", StaleFactor: 3},
		Log:   Log{Level: "info", Format: "auto"},
		Cluster: Cluster{
			Bucket:   "syncd_leader",
			Key:      "leader",
			LeaseTTL: Duration{10 * time.Second},
		},
		KV: KV{
			Enabled:           true,
			Tags:              "syncd_tags",
			Repos:             "syncd_repos",
			Advisories:        "syncd_advisories",
			Matured:           "syncd_matured",
			History:           1,
			ReconcileInterval: Duration{time.Hour},
		},
		Snapshot: Snapshot{
			Enabled: true,
			Every:   Duration{6 * time.Hour},
			Keep:    2,
			Bucket:  "syncd_snapshots",
		},
		Verify: Verify{
			CheckpointEvery: Duration{time.Minute},
			AuditEvery:      Duration{5 * time.Minute},
			SweepEvery:      Duration{24 * time.Hour},
		},
		Sync: Sync{Timeout: Duration{DefaultSyncTimeout}},
		Query: Query{
			Enabled:     true,
			Prefix:      "syncd-query",
			MaxWait:     Duration{5 * time.Second},
			MaxLimit:    1000,
			Concurrency: 4,
			MaxPending:  256,
		},
		Maturity: Maturity{After: []string{}},
	}
}

// DefaultSTSURL is the vendor's issuer, where identity tokens are exchanged.
const DefaultSTSURL = "https://issuer.enforce.dev"

// Node is this replica's name in the lease: node_id, or hostname-pid when
// it is empty, so that two replicas on one host still differ.
func (cl Cluster) Node() string {
	if cl.NodeID != "" {
		return cl.NodeID
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "syncd"
	}
	return fmt.Sprintf("%s-%d", host, os.Getpid())
}

// ConsumerName is the durable consumer of the mirror at mirrorPath:
// consumer, or when it is empty syncd-follow-<node_id>, or without a
// node_id syncd-follow-<host>-<a hash of the mirror's absolute path>. The
// name stays the same across restarts, so a follower resumes where it
// stopped instead of starting over under a new name (the process id in
// Node would change it) and leaving the old consumer behind; and two
// mirrors on one host get two consumers.
func (cl Cluster) ConsumerName(mirrorPath string) string {
	if cl.Consumer != "" {
		return cl.Consumer
	}
	if cl.NodeID != "" {
		return "syncd-follow-" + kvSafe.ReplaceAllString(cl.NodeID, "_")
	}
	host, err := os.Hostname()
	if err != nil || host == "" {
		host = "syncd"
	}
	if abs, err := filepath.Abs(mirrorPath); err == nil {
		mirrorPath = abs
	}
	sum := sha256.Sum256([]byte(mirrorPath))
	return "syncd-follow-" + kvSafe.ReplaceAllString(host, "_") + "-" + hex.EncodeToString(sum[:4])
}

// kvSafe matches what a host name may hold but a consumer name may not.
var kvSafe = regexp.MustCompile(`[^-_A-Za-z0-9]`)

// RegistryHost is the host[:port] of registry_url, the registry's audience
// unless registry_audience says otherwise.
func (p *Platform) RegistryHost() string {
	u, err := url.Parse(p.RegistryURL)
	if err != nil {
		return ""
	}
	return u.Host
}

// EventTypePrefix begins the types of the platform's pushed events:
// [events] type_prefix, or "dev.<vendor>.".
func (c Config) EventTypePrefix() string {
	if c.Events.TypePrefix != "" {
		return c.Events.TypePrefix
	}
	return "dev." + c.Platform.Vendor + "."
}
