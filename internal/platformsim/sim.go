package platformsim

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"math/rand/v2"
	"net/http"
	"regexp"
	"sync"
	"time"
)

// Options configures a simulator. The zero value is usable: every field has a
// default that mirrors the upstream service.
type Options struct {
	// Seed makes the populated organization, the scenario engine, generated
	// uids and fault decisions reproducible.
	Seed int64
	// OrgName is the organization's registry namespace (default "acme").
	OrgName string
	// RootGroup is the uid of the organization's root group (default "org1").
	// Uids are hierarchical: repo "org1/<seg>", tag "org1/<seg>/<seg>".
	RootGroup string
	// Vendor is the word in the tag history path `_<vendor>` and in event
	// type strings (default "chainguard").
	Vendor string
	// PublicOrg is the registry namespace of free-tier public images
	// (default "chainguard").
	PublicOrg string
	// Tokens lists platform bearer tokens accepted with full organization
	// access, in addition to tokens minted through the control API.
	// Empty means only minted tokens are accepted.
	Tokens []string
	// Clock is the base clock (default time.Now). The simulator's time is
	// Clock() plus the offset accumulated by Advance.
	Clock func() time.Time
	// StartInclusive and EndInclusive decide whether the tag history bounds
	// `start` and `end` include records stamped exactly at the bound; the
	// spec leaves this open, so clients must cope with either.
	StartInclusive bool
	EndInclusive   bool
	// HistoryEndNewest, when set, makes a tag history request that carries
	// `end` but no `start` return the newest 1000 records before `end`
	// instead of the oldest, a behaviour seen upstream.
	HistoryEndNewest bool
	// ErrorDomain is ErrorInfo.domain in error bodies (default "<vendor>.dev").
	ErrorDomain string
	// BaseURL is the simulator's own address, used as the OIDC issuer and
	// as the CloudEvents source. When empty it is learned from the first
	// request's Host header (see SetBaseURL).
	BaseURL string
	// AllowHTTPSinks lets subscriptions use http:// sinks; the upstream only
	// accepts https://, but test receivers listen on plain loopback HTTP.
	AllowHTTPSinks bool
	// PageTokenTTL is the validity of list page tokens in simulator time
	// (default 72h, the spec's 3 days).
	PageTokenTTL time.Duration
	// RegistryTokenTTL bounds registry tokens in simulator time; zero means
	// they never expire (the spec leaves the lifetime open).
	RegistryTokenTTL time.Duration
	// DeliveryBackoff is the first retry delay of event delivery, doubled on
	// each failure up to DeliveryMaxBackoff (defaults 500ms and 30s).
	DeliveryBackoff    time.Duration
	DeliveryMaxBackoff time.Duration
	// DeliveryAttempts caps delivery attempts per event (default 10).
	DeliveryAttempts int
	// EventAudience is the `aud` claim and Ce-Audience of delivered events
	// (default "customer").
	EventAudience string
	// DeliveryClient sends events to sinks (default: a client with a 10s
	// timeout).
	DeliveryClient *http.Client
	// Rates weights the kinds of mutation Step applies (default DefaultRates()).
	Rates Rates
}

// Scale sizes a generated organization.
type Scale struct {
	Repos, TagsPerRepo, HistoryPerTag, Advisories int
	// HeavyTags tags (spread over the org) get HeavyHistory records each
	// instead of HistoryPerTag, and their histories contain runs of records
	// sharing one timestamp that straddle every 1000-record boundary.
	HeavyTags, HeavyHistory int
	// PublicImages is the number of public-organization images, each with
	// tags latest, latest-dev and a version tag (default 3; -1 for none).
	PublicImages int
}

// ScaleScenario is the organization of the scale benchmark: 1,000 repos,
// 50,000 tags, about 1,000,000 history records (20 tags over 5,000) and
// 20,000 advisories.
func ScaleScenario() Scale {
	return Scale{Repos: 1000, TagsPerRepo: 50, HistoryPerTag: 18, Advisories: 20000,
		HeavyTags: 20, HeavyHistory: 5999}
}

// Sim is an in-memory simulator of the platform API v2 and the registry's
// tag history API. All methods are safe for concurrent use.
type Sim struct {
	opts Options

	mu     sync.RWMutex
	offset time.Duration
	rng    *rand.Rand // scenario and uid generation; guarded by mu
	key    []byte     // HMAC key for registry tokens

	identityName *regexp.Regexp

	groups        map[string]*group
	repos         map[string]*repo
	tags          map[string]*tag
	advisories    map[string]*advisory
	identities    map[string]*identity
	roles         map[string]*role
	bindings      map[string]*roleBinding
	subscriptions map[string]*subscription
	public        map[string]*publicImage
	minted        map[string]mintedToken // platform tokens minted by the sim

	// Ordered indexes, so the seeded scenario picks the same resources on
	// every run (map iteration order is random).
	repoList []*repo
	tagList  []*tag
	advList  []*advisory

	stats   stats
	faults  faultSet
	oidcKey oidcKey
	events  delivery
}

type mintedToken struct {
	group    string // scope of the token: the identity's parent group
	identity string // "" for an organization admin token
	subject  string
}

// New returns an empty simulator holding only the organization's root group
// and the built-in roles. Call Populate to generate data.
func New(opts Options) *Sim {
	if opts.OrgName == "" {
		opts.OrgName = "acme"
	}
	if opts.RootGroup == "" {
		opts.RootGroup = "org1"
	}
	if opts.Vendor == "" {
		opts.Vendor = "chainguard"
	}
	if opts.PublicOrg == "" {
		opts.PublicOrg = "chainguard"
	}
	if opts.Clock == nil {
		opts.Clock = time.Now
	}
	if opts.ErrorDomain == "" {
		opts.ErrorDomain = opts.Vendor + ".dev"
	}
	if opts.PageTokenTTL == 0 {
		opts.PageTokenTTL = 72 * time.Hour
	}
	if opts.DeliveryBackoff == 0 {
		opts.DeliveryBackoff = 500 * time.Millisecond
	}
	if opts.DeliveryMaxBackoff == 0 {
		opts.DeliveryMaxBackoff = 30 * time.Second
	}
	if opts.DeliveryAttempts == 0 {
		opts.DeliveryAttempts = 10
	}
	if opts.DeliveryClient == nil {
		opts.DeliveryClient = &http.Client{Timeout: 10 * time.Second}
	}
	if opts.Rates == (Rates{}) {
		opts.Rates = DefaultRates()
	}
	s := &Sim{
		opts:          opts,
		rng:           rand.New(rand.NewPCG(uint64(opts.Seed), 0x5eed5eed)),
		groups:        map[string]*group{},
		repos:         map[string]*repo{},
		tags:          map[string]*tag{},
		advisories:    map[string]*advisory{},
		identities:    map[string]*identity{},
		roles:         map[string]*role{},
		bindings:      map[string]*roleBinding{},
		subscriptions: map[string]*subscription{},
		public:        map[string]*publicImage{},
		minted:        map[string]mintedToken{},
		identityName:  regexp.MustCompile(identityNamePattern),
	}
	mac := hmac.New(sha256.New, []byte("platformsim registry token key"))
	_ = binary.Write(mac, binary.BigEndian, opts.Seed)
	s.key = mac.Sum(nil)
	s.faults.rng = rand.New(rand.NewPCG(uint64(opts.Seed), 0xfa17))

	now := s.nowMs()
	s.groups[opts.RootGroup] = &group{uid: opts.RootGroup, name: opts.OrgName,
		description: "root group of " + opts.OrgName, createMs: now, updateMs: now}
	for _, r := range builtinRoles() {
		r.createMs, r.updateMs = now, now
		s.roles[r.uid] = r
	}
	return s
}

// builtinRoles are the platform's predefined roles; their uids carry no
// group prefix because they belong to no organization.
func builtinRoles() []*role {
	return []*role{
		{uid: "a8c1e3f0b9d2c4e5f60718293a4b5c6d7e8f9001", name: "viewer",
			description:  "Read-only access to the organization's resources",
			capabilities: []string{"groups.list", "repo.list", "tag.list", "advisories.list", "subscriptions.list"}},
		{uid: "b7d2f4e1c8a3b5d6e7f8091a2b3c4d5e6f708192", name: "editor",
			description:  "Read and write access to the organization's resources",
			capabilities: []string{"groups.list", "repo.list", "repo.create", "repo.update", "tag.list", "tag.create"}},
		{uid: "c6e3a5f2d7b4c6e7f8091a2b3c4d5e6f70819203", name: "owner",
			description:  "Full access to the organization, including IAM",
			capabilities: []string{"groups.create", "groups.delete", "identity.create", "identity.delete", "role_bindings.create"}},
		{uid: "d5f4b6a3e6c5d7e8f9102a3b4c5d6e7f80910314", name: "registry.pull",
			description:  "Pull images from the organization's registry",
			capabilities: []string{"registry.pull", "repo.list", "tag.list"}},
		{uid: "e4a5c7b4f5d6e8f9a0213b4c5d6e7f8091a20425", name: "registry.push",
			description:  "Push images to the organization's registry",
			capabilities: []string{"registry.pull", "registry.push", "repo.list", "tag.list"}},
	}
}

// now returns the simulator's current time.
func (s *Sim) now() time.Time {
	s.mu.RLock()
	off := s.offset
	s.mu.RUnlock()
	return s.opts.Clock().Add(off)
}

// nowLocked is now for callers that already hold mu.
func (s *Sim) nowLocked() time.Time { return s.opts.Clock().Add(s.offset) }

func (s *Sim) nowMs() int64 { return s.now().UnixMilli() }

// Now returns the simulator's current time.
func (s *Sim) Now() time.Time { return s.now() }

// Advance moves the simulator clock forward by d (backwards if negative).
func (s *Sim) Advance(d time.Duration) {
	s.mu.Lock()
	s.offset += d
	s.mu.Unlock()
}

// Run applies perStep mutations every interval of real time until ctx is
// done, so a demo shows a changing organization.
func (s *Sim) Run(ctx context.Context, every time.Duration, perStep int) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			s.Step(perStep)
		}
	}
}
