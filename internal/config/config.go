// Package config loads syncd's configuration: defaults first, then a TOML file
// decoded strictly, then SYNCD_<SECTION>_<KEY> environment overrides, then
// validation. Every error names the key it is about and, where the file has
// it, the line.
package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/BurntSushi/toml"
	"github.com/robfig/cron/v3"
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
		},
		Store: Store{
			Path:           "data/syncd.db",
			EventRetention: Duration{30 * 24 * time.Hour},
			InitialEvents:  "none",
		},
		Admin: Admin{Listen: "127.0.0.1:9090", StaleFactor: 3},
		Log:   Log{Level: "info", Format: "auto"},
		Cluster: Cluster{
			Bucket:   "syncd_leader",
			Key:      "leader",
			LeaseTTL: Duration{10 * time.Second},
		},
	}
}

// Error is a configuration problem tied to one key.
type Error struct {
	Key    string // dotted key, e.g. "nats.url"
	Source string // file name or environment variable; empty for a default
	Line   int    // line in Source, 0 when unknown
	Msg    string
}

func (e *Error) Error() string {
	var b strings.Builder
	if e.Source != "" {
		b.WriteString(e.Source)
		if e.Line > 0 {
			fmt.Fprintf(&b, ":%d", e.Line)
		}
		b.WriteString(": ")
	}
	if e.Key != "" {
		fmt.Fprintf(&b, "%s: ", e.Key)
	}
	b.WriteString(e.Msg)
	return b.String()
}

// Load returns Default overlaid with the file at path (skipped when path is
// empty) and then with environment variables from environ (os.Environ form).
// The result is validated.
func Load(path string, environ []string) (Config, error) {
	cfg := Default()
	var src []byte
	if path != "" {
		var err error
		if src, err = os.ReadFile(path); err != nil {
			return cfg, &Error{Source: path, Msg: fmt.Sprintf("read config: %v", err)}
		}
		if err := decode(&cfg, path, src); err != nil {
			return cfg, err
		}
	}
	if err := applyEnv(&cfg, environ); err != nil {
		return cfg, err
	}
	if err := cfg.Validate(); err != nil {
		var ce *Error
		if errors.As(err, &ce) && path != "" && ce.Source == "" {
			if line := keyLine(src, ce.Key); line > 0 {
				ce.Source, ce.Line = path, line
			}
		}
		return cfg, err
	}
	return cfg, nil
}

func decode(cfg *Config, path string, src []byte) error {
	md, err := toml.NewDecoder(bytes.NewReader(src)).Decode(cfg)
	if err != nil {
		var pe toml.ParseError
		if ppe := (*toml.ParseError)(nil); errors.As(err, &ppe) {
			pe = *ppe
		} else if !errors.As(err, &pe) {
			// Type mismatches come back as plain errors: 'toml: line N (last key "k"): msg'.
			if m := typeErr.FindStringSubmatch(err.Error()); m != nil {
				line, _ := strconv.Atoi(m[1])
				return &Error{Source: path, Line: line, Key: m[2], Msg: m[3]}
			}
			return &Error{Source: path, Msg: err.Error()}
		}
		msg := pe.Message
		if msg == "" {
			msg = pe.Error()
		}
		return &Error{Source: path, Line: pe.Position.Line, Key: pe.LastKey, Msg: msg}
	}
	if und := md.Undecoded(); len(und) > 0 {
		k := und[0].String()
		return &Error{Source: path, Line: keyLine(src, k), Key: k, Msg: "unknown key (see config.example.toml for the keys syncd knows)"}
	}
	return nil
}

// keyLine finds the line where a dotted key is set in TOML source, so that
// errors found after decoding can still point at the file. 0 when not found.
var typeErr = regexp.MustCompile(`^toml: (?:line (\d+) )?\(last key "([^"]+)"\): (.*)$`)

func keyLine(src []byte, key string) int {
	parts := strings.Split(key, ".")
	if len(parts) == 0 {
		return 0
	}
	section, name := strings.Join(parts[:len(parts)-1], "."), parts[len(parts)-1]
	cur := ""
	sc := bufio.NewScanner(bytes.NewReader(src))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			if cur = strings.Trim(line, "[] \t"); cur == key {
				return n
			}
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k = strings.Trim(strings.TrimSpace(k), `"`)
		if (cur == section && k == name) || (cur == "" && k == key) {
			return n
		}
	}
	return 0
}

// applyEnv sets every field named by a SYNCD_<SECTION>_<KEY> variable.
func applyEnv(cfg *Config, environ []string) error {
	env := make(map[string]string)
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "SYNCD_") {
			env[k] = v
		}
	}
	if len(env) == 0 {
		return nil
	}
	known := make(map[string]bool)
	root := reflect.ValueOf(cfg).Elem()
	for i := 0; i < root.NumField(); i++ {
		section := root.Type().Field(i).Tag.Get("toml")
		sv := root.Field(i)
		for j := 0; j < sv.NumField(); j++ {
			key := sv.Type().Field(j).Tag.Get("toml")
			name := "SYNCD_" + strings.ToUpper(section) + "_" + strings.ToUpper(key)
			known[name] = true
			v, ok := env[name]
			if !ok {
				continue
			}
			if err := setField(sv.Field(j), v); err != nil {
				return &Error{Source: name, Key: section + "." + key, Msg: err.Error()}
			}
		}
	}
	for name := range env {
		if !known[name] && !strings.HasPrefix(name, "SYNCD_TEST_") {
			return &Error{Source: name, Msg: "unknown environment override (want SYNCD_<SECTION>_<KEY> for a key in config.example.toml)"}
		}
	}
	return nil
}

func setField(f reflect.Value, v string) error {
	if u, ok := f.Addr().Interface().(interface{ UnmarshalText([]byte) error }); ok {
		return u.UnmarshalText([]byte(v))
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString(v)
	case reflect.Int:
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("not an integer: %q", v)
		}
		f.SetInt(int64(n))
	case reflect.Float64:
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("not a number: %q", v)
		}
		f.SetFloat(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean: %q", v)
		}
		f.SetBool(b)
	case reflect.Slice:
		var items []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
		f.Set(reflect.ValueOf(items))
	default:
		return fmt.Errorf("cannot set a %s from the environment", f.Kind())
	}
	return nil
}

// cronSpec is the schedule syntax syncd accepts: standard five fields,
// optional seconds, and descriptors such as "@every 5m" and "@hourly".
const cronSpec = cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor

// ParseSchedule parses a cron schedule as syncd's config accepts it; the
// empty string is no schedule (nil), which turns a job off.
func ParseSchedule(s string) (cron.Schedule, error) {
	if s == "" {
		return nil, nil
	}
	return cron.NewParser(cronSpec).Parse(s)
}

// Validate checks values that decode fine but make no sense. Platform
// settings that the demo fills in are checked separately by RequirePlatform.
func (c *Config) Validate() error {
	for _, u := range []struct{ key, val string }{
		{"platform.base_url", c.Platform.BaseURL},
		{"platform.registry_url", c.Platform.RegistryURL},
	} {
		if u.val == "" {
			continue
		}
		p, err := url.Parse(u.val)
		if err != nil || (p.Scheme != "http" && p.Scheme != "https") || p.Host == "" {
			return &Error{Key: u.key, Msg: fmt.Sprintf("not an http(s) URL: %q", u.val)}
		}
	}
	if err := c.Platform.validateCredentials(); err != nil {
		return err
	}
	if c.Platform.Timeout.Duration <= 0 {
		return &Error{Key: "platform.timeout", Msg: "must be positive"}
	}
	for _, f := range c.Crawl.TagFamilies {
		if _, ok := tagFamilies[f]; !ok {
			return &Error{Key: "crawl.tag_families", Msg: fmt.Sprintf("unknown tag family %q (want \"dates\", \"epochs\" or \"referrers\")", f)}
		}
	}
	for _, sc := range []struct{ key, val string }{
		{"crawl.schedule", c.Crawl.Schedule},
		{"crawl.sweep_schedule", c.Crawl.SweepSchedule},
		{"crawl.advisories_schedule", c.Crawl.AdvisoriesSchedule},
		{"crawl.subscriptions_schedule", c.Crawl.SubscriptionsSchedule},
	} {
		if sc.val == "" {
			continue // the job is off
		}
		if _, err := ParseSchedule(sc.val); err != nil {
			return &Error{Key: sc.key, Msg: fmt.Sprintf("unparsable schedule %q: %v", sc.val, err)}
		}
	}
	if c.Crawl.Schedule == "" {
		return &Error{Key: "crawl.schedule", Msg: "required: the incremental crawl cannot be turned off"}
	}
	if c.Crawl.Jitter.Duration < 0 {
		return &Error{Key: "crawl.jitter", Msg: "must not be negative"}
	}
	if c.Crawl.Concurrency < 1 || c.Crawl.Concurrency > 64 {
		return &Error{Key: "crawl.concurrency", Msg: fmt.Sprintf("must be between 1 and 64, got %d", c.Crawl.Concurrency)}
	}
	if c.Crawl.RequestsPerSecond < 0 {
		return &Error{Key: "crawl.requests_per_second", Msg: "must not be negative (0 means unlimited)"}
	}
	if err := c.Events.validate(); err != nil {
		return err
	}
	if c.NATS.URL != "" {
		for _, u := range strings.Split(c.NATS.URL, ",") {
			p, err := url.Parse(strings.TrimSpace(u))
			if err != nil || p.Host == "" || !strings.HasPrefix(p.Scheme, "nats") && !strings.HasPrefix(p.Scheme, "tls") && !strings.HasPrefix(p.Scheme, "ws") {
				return &Error{Key: "nats.url", Msg: fmt.Sprintf("not a NATS URL (want nats://host:port): %q", u)}
			}
		}
	}
	if c.NATS.Listen != "" {
		if _, _, err := net.SplitHostPort(c.NATS.Listen); err != nil {
			return &Error{Key: "nats.listen", Msg: fmt.Sprintf("not a host:port: %q", c.NATS.Listen)}
		}
	}
	if !validToken(c.NATS.SubjectPrefix) {
		return &Error{Key: "nats.subject_prefix", Msg: fmt.Sprintf("must be a non-empty NATS subject without wildcards or spaces: %q", c.NATS.SubjectPrefix)}
	}
	if c.NATS.Stream == "" || strings.ContainsAny(c.NATS.Stream, ".*> \t/\\") {
		return &Error{Key: "nats.stream", Msg: fmt.Sprintf("must be a stream name without '.', '*', '>', '/' or spaces: %q", c.NATS.Stream)}
	}
	if c.NATS.DuplicateWindow.Duration <= 0 {
		return &Error{Key: "nats.duplicate_window", Msg: "must be positive"}
	}
	if c.NATS.MaxAge.Duration < 0 || (c.NATS.MaxAge.Duration > 0 && c.NATS.MaxAge.Duration < c.NATS.DuplicateWindow.Duration) {
		return &Error{Key: "nats.max_age", Msg: "must be 0 (unlimited) or at least duplicate_window"}
	}
	if err := c.NATS.validateConnection(); err != nil {
		return err
	}
	if c.Store.Path == "" {
		return &Error{Key: "store.path", Msg: "required"}
	}
	if c.Store.EventRetention.Duration <= 0 {
		return &Error{Key: "store.event_retention", Msg: "must be positive"}
	}
	switch c.Store.InitialEvents {
	case "none", "snapshot":
	default:
		return &Error{Key: "store.initial_events", Msg: fmt.Sprintf("must be \"none\" or \"snapshot\", got %q", c.Store.InitialEvents)}
	}
	if c.Admin.Listen != "" {
		if _, _, err := net.SplitHostPort(c.Admin.Listen); err != nil {
			return &Error{Key: "admin.listen", Msg: fmt.Sprintf("not a host:port: %q", c.Admin.Listen)}
		}
	}
	if c.Admin.StaleFactor < 1 {
		return &Error{Key: "admin.stale_factor", Msg: fmt.Sprintf("must be at least 1, got %g", c.Admin.StaleFactor)}
	}
	switch strings.ToLower(c.Log.Level) {
	case "debug", "info", "warn", "error":
	default:
		return &Error{Key: "log.level", Msg: fmt.Sprintf("must be debug, info, warn or error, got %q", c.Log.Level)}
	}
	switch c.Log.Format {
	case "auto", "text", "json":
	default:
		return &Error{Key: "log.format", Msg: fmt.Sprintf("must be auto, text or json, got %q", c.Log.Format)}
	}
	return c.validateCluster()
}

// kvName is what NATS accepts as a KV bucket or key name (the KV's own rule,
// kept stricter: no dots, so the key is one subject token).
var kvName = regexp.MustCompile(`^[-_A-Za-z0-9]+$`)

func (c *Config) validateCluster() error {
	cl := c.Cluster
	if !kvName.MatchString(cl.Bucket) {
		return &Error{Key: "cluster.bucket", Msg: fmt.Sprintf("must be a KV bucket name of letters, digits, '-' and '_': %q", cl.Bucket)}
	}
	if !kvName.MatchString(cl.Key) {
		return &Error{Key: "cluster.key", Msg: fmt.Sprintf("must be a KV key of letters, digits, '-' and '_': %q", cl.Key)}
	}
	// Below a second the renewals (every third of the TTL) race the
	// server's expiry timer and ordinary network latency.
	if cl.LeaseTTL.Duration < time.Second {
		return &Error{Key: "cluster.lease_ttl", Msg: fmt.Sprintf("must be at least 1s, got %s", cl.LeaseTTL.Duration)}
	}
	if cl.NodeID != "" && !kvName.MatchString(cl.NodeID) {
		return &Error{Key: "cluster.node_id", Msg: fmt.Sprintf("must be letters, digits, '-' and '_': %q", cl.NodeID)}
	}
	if cl.Consumer != "" && !kvName.MatchString(cl.Consumer) {
		return &Error{Key: "cluster.consumer", Msg: fmt.Sprintf("must be a consumer name of letters, digits, '-' and '_': %q", cl.Consumer)}
	}
	if !cl.Enabled {
		return nil
	}
	if c.NATS.URL == "" {
		return &Error{Key: "nats.url", Msg: "required with cluster.enabled = true: replicas share an external NATS server (the embedded one dies with its syncd)"}
	}
	// Followers build their mirrors from the stream alone, so the baseline
	// must be in it.
	if c.Store.InitialEvents != "snapshot" {
		return &Error{Key: "store.initial_events", Msg: fmt.Sprintf("must be \"snapshot\" with cluster.enabled = true, got %q: standbys and followers learn the baseline from the stream", c.Store.InitialEvents)}
	}
	return nil
}

func (e *Events) validate() error {
	if e.Listen != "" {
		if _, _, err := net.SplitHostPort(e.Listen); err != nil {
			return &Error{Key: "events.listen", Msg: fmt.Sprintf("not a host:port: %q", e.Listen)}
		}
	}
	if e.SinkURL != "" {
		u, err := url.Parse(e.SinkURL)
		if err != nil || u.Host == "" || (u.Scheme != "https" && !(u.Scheme == "http" && isLoopback(u.Hostname()))) {
			return &Error{Key: "events.sink_url", Msg: fmt.Sprintf("must be an https:// URL (http:// only on loopback): %q", e.SinkURL)}
		}
		if e.Listen == "" {
			return &Error{Key: "events.listen", Msg: "required when sink_url is set: the address the receiver listens on"}
		}
		if e.Issuer == "" {
			return &Error{Key: "events.issuer", Msg: "required when sink_url is set: the vendor's OIDC issuer that signs deliveries"}
		}
	}
	if e.Issuer != "" {
		if u, err := url.Parse(e.Issuer); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
			return &Error{Key: "events.issuer", Msg: fmt.Sprintf("not an http(s) URL: %q", e.Issuer)}
		}
	}
	if e.Audience == "" {
		return &Error{Key: "events.audience", Msg: "required"}
	}
	if e.MaxBody < 1024 {
		return &Error{Key: "events.max_body", Msg: fmt.Sprintf("must be at least 1024 bytes, got %d", e.MaxBody)}
	}
	if e.QueueSize < 1 {
		return &Error{Key: "events.queue_size", Msg: fmt.Sprintf("must be positive, got %d", e.QueueSize)}
	}
	return nil
}

func isLoopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// RequirePlatform checks the keys a real (non-demo) run cannot do without.
func (c *Config) RequirePlatform() error {
	switch {
	case c.Platform.BaseURL == "":
		return &Error{Key: "platform.base_url", Msg: "required (the platform API address, e.g. https://console-api.example.com)"}
	case c.Platform.RegistryURL == "":
		return &Error{Key: "platform.registry_url", Msg: "required (the registry address, e.g. https://cgr.example.com)"}
	case c.Platform.Group == "":
		return &Error{Key: "platform.group", Msg: "required (the uid of the organization's root group)"}
	case c.Platform.Organization == "":
		return &Error{Key: "platform.organization", Msg: "required (the organization's name in registry paths)"}
	case c.Platform.Identity == "" && c.Platform.Token == "" && c.Platform.TokenFile == "" && c.Platform.TokenCommand == "":
		return &Error{Key: "platform.token", Msg: "required: set one of token, token_file or token_command, or assume an identity with identity and identity_token_file"}
	}
	return nil
}

func validToken(subject string) bool {
	if subject == "" {
		return false
	}
	for _, tok := range strings.Split(subject, ".") {
		if tok == "" || strings.ContainsAny(tok, "*> \t\r\n") {
			return false
		}
	}
	return true
}

// validateConnection checks the [nats] keys about reaching an external
// server: replicas, authentication and TLS. Files are opened here so that a
// wrong path fails at start with the key's name, not at the first reconnect.
func (n *NATS) validateConnection() error {
	if n.Replicas < 1 || n.Replicas > 5 {
		return &Error{Key: "nats.replicas", Msg: fmt.Sprintf("must be between 1 and 5 (JetStream's limit), got %d", n.Replicas)}
	}
	external := []struct{ key, val string }{
		{"nats.credentials", n.Credentials}, {"nats.nkey_seed", n.NKeySeed}, {"nats.token", n.Token},
		{"nats.user", n.User}, {"nats.password", n.Password},
		{"nats.tls_ca", n.TLSCA}, {"nats.tls_cert", n.TLSCert}, {"nats.tls_key", n.TLSKey},
	}
	if n.URL == "" {
		// The embedded server has neither authentication nor TLS: a key set
		// here most likely means nats.url was forgotten.
		for _, k := range external {
			if k.val != "" {
				return &Error{Key: k.key, Msg: "only applies to an external server: set nats.url too"}
			}
		}
		if n.Replicas > 1 {
			return &Error{Key: "nats.replicas", Msg: "the embedded server is a single node: replicas must be 1 unless nats.url names a cluster"}
		}
	}
	// Pairs name the key that is set, so the error can point at its line.
	if n.User != "" && n.Password == "" {
		return &Error{Key: "nats.user", Msg: "set nats.password too: user and password come together"}
	}
	if n.Password != "" && n.User == "" {
		return &Error{Key: "nats.password", Msg: "set nats.user too: user and password come together"}
	}
	var methods []string
	for _, m := range []struct{ key, val string }{
		{"nats.credentials", n.Credentials}, {"nats.nkey_seed", n.NKeySeed}, {"nats.token", n.Token}, {"nats.user", n.User},
	} {
		if m.val != "" {
			methods = append(methods, m.key)
		}
	}
	if len(methods) > 1 {
		return &Error{Key: methods[1], Msg: fmt.Sprintf("set only one way to authenticate: %s", strings.Join(methods, " and "))}
	}
	if n.TLSCert != "" && n.TLSKey == "" {
		return &Error{Key: "nats.tls_cert", Msg: "set nats.tls_key too: the client certificate and its key come together"}
	}
	if n.TLSKey != "" && n.TLSCert == "" {
		return &Error{Key: "nats.tls_key", Msg: "set nats.tls_cert too: the client certificate and its key come together"}
	}
	for _, f := range []struct{ key, path string }{
		{"nats.credentials", n.Credentials}, {"nats.nkey_seed", n.NKeySeed},
		{"nats.tls_ca", n.TLSCA}, {"nats.tls_cert", n.TLSCert}, {"nats.tls_key", n.TLSKey},
	} {
		if f.path == "" {
			continue
		}
		if err := readable(f.path); err != nil {
			return &Error{Key: f.key, Msg: err.Error()}
		}
	}
	return nil
}

// readable reports why path is not a regular file this process can read.
func readable(path string) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("cannot read %q: %v", path, errors.Unwrap(err))
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return fmt.Errorf("cannot read %q: %v", path, err)
	}
	if st.IsDir() {
		return fmt.Errorf("%q is a directory, want a file", path)
	}
	return nil
}

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

// ConsumerName is the durable consumer of this mirror: consumer, or
// syncd-follow-<node> when it is empty. node is Node(), passed in so that
// the name is computed once for a process.
func (cl Cluster) ConsumerName(node string) string {
	if cl.Consumer != "" {
		return cl.Consumer
	}
	return "syncd-follow-" + kvSafe.ReplaceAllString(node, "_")
}

// kvSafe matches what a host name may hold but a consumer name may not.
var kvSafe = regexp.MustCompile(`[^-_A-Za-z0-9]`)

// DefaultSTSURL is the vendor's issuer, where identity tokens are exchanged.
const DefaultSTSURL = "https://issuer.enforce.dev"

// tagFamilies are the values [crawl] tag_families accepts.
var tagFamilies = map[string]struct{}{"dates": {}, "epochs": {}, "referrers": {}}

// validateCredentials checks that each audience gets its credential from
// one source: at most one platform token source, at most one registry
// credential source, and an identity to assume only instead of both.
func (p *Platform) validateCredentials() error {
	api := setKeys(map[string]string{"platform.token": p.Token, "platform.token_file": p.TokenFile, "platform.token_command": p.TokenCommand})
	if len(api) > 1 {
		return &Error{Key: api[0], Msg: fmt.Sprintf("set only one platform credential: %s are both set", strings.Join(api, " and "))}
	}
	registry := setKeys(map[string]string{"platform.registry_token": p.RegistryToken, "platform.registry_token_file": p.RegistryTokenFile,
		"platform.registry_token_command": p.RegistryTokenCommand, "platform.registry_credential_helper": p.RegistryCredentialHelper})
	if len(registry) > 1 {
		return &Error{Key: registry[0], Msg: fmt.Sprintf("set only one registry credential: %s are both set", strings.Join(registry, " and "))}
	}
	if p.RegistryCredentialHelper != "" && strings.ContainsAny(p.RegistryCredentialHelper, "/ \t") {
		return &Error{Key: "platform.registry_credential_helper", Msg: fmt.Sprintf("the helper's name, as in docker-credential-<name> (e.g. \"cgr\"), got %q", p.RegistryCredentialHelper)}
	}
	if p.Identity == "" {
		if p.IdentityTokenFile != "" {
			return &Error{Key: "platform.identity_token_file", Msg: "only applies with platform.identity (the identity to assume)"}
		}
		return nil
	}
	if clash := append(api, registry...); len(clash) > 0 {
		return &Error{Key: clash[0], Msg: "platform.identity gives the credentials of both audiences by token exchange: remove " + strings.Join(clash, " and ") + ", or remove platform.identity"}
	}
	if p.IdentityTokenFile == "" {
		return &Error{Key: "platform.identity_token_file", Msg: "required with platform.identity: the file holding the external OIDC token to exchange (e.g. a Kubernetes projected service account token)"}
	}
	if u, err := url.Parse(p.STSURL); err != nil || u.Host == "" || (u.Scheme != "https" && u.Scheme != "http") {
		return &Error{Key: "platform.sts_url", Msg: fmt.Sprintf("not an http(s) URL: %q", p.STSURL)}
	}
	return nil
}

// setKeys returns the keys of m whose value is set, sorted.
func setKeys(m map[string]string) []string {
	var keys []string
	for k, v := range m {
		if v != "" {
			keys = append(keys, k)
		}
	}
	slices.Sort(keys)
	return keys
}

// RegistryHost is the host[:port] of registry_url, the registry's audience
// unless registry_audience says otherwise.
func (p *Platform) RegistryHost() string {
	u, err := url.Parse(p.RegistryURL)
	if err != nil {
		return ""
	}
	return u.Host
}
