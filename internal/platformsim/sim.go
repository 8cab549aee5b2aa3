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
	// Rates weights the kinds of mutation Step applies (default DefaultRates(),
	// or StrictRates() with Strict).
	Rates Rates

	// Strict turns on every rule of the real service that would change what
	// existing users of the simulator see: EnforceAudiences, HideTagFamilies,
	// UpdatedSinceExclusive, ProtoJSON and CivilPushTime. The finer options
	// below can also be set one by one.
	Strict bool
	// EnforceAudiences refuses a platform-audience token at the registry's
	// /token with 403, as the real registry does; without it /token accepts
	// platform tokens too. Registry-audience tokens are refused by the
	// platform API (401) and platform tokens by the tag history endpoint
	// (403) in either case.
	EnforceAudiences bool
	// HideTagFamilies leaves tags named sha256-* (referrers), *-20yymmdd
	// (dates) and *-r<N> (epochs) out of GET /registry/v2/tags unless
	// include_referrers, include_dates or include_epochs is true.
	HideTagFamilies bool
	// UpdatedSinceExclusive makes the tag list's updated_since keep only tags
	// updated strictly after the timestamp, the proto's wording; without it
	// a tag updated exactly at the timestamp is kept too.
	UpdatedSinceExclusive bool
	// ProtoJSON renders platform resources as the real gateway's protojson
	// does: fields at their zero value omitted, timestamps with 0, 3, 6 or 9
	// fractional digits, enum names in full, and fields no client knows yet
	// added to resources, list envelopes and tag history.
	ProtoJSON bool
	// CivilPushTime renders a push event's `when` as a civil date-time
	// without a zone, as upstream does.
	CivilPushTime bool
	// PushRepositoryUID puts the repo's uid in a push event's `repository`
	// instead of its registry path (upstream once switched to uids).
	PushRepositoryUID bool

	// RegistryTokens lists registry-audience credentials with the
	// organization's access (what `chainctl auth token --audience <registry>`
	// or the Docker credential helper gives), in addition to minted ones.
	RegistryTokens []string
	// APIAudience is the audience of platform API tokens (default the base
	// URL); RegistryAudience that of registry credentials (default the base
	// URL's host[:port]). Token exchange mints tokens for these.
	APIAudience      string
	RegistryAudience string
	// ExchangeTokenTTL is the lifetime, in simulator time, of tokens minted
	// by POST /sts/exchange (default 1h).
	ExchangeTokenTTL time.Duration
	// ExternalTokenAudience is the audience an external token must carry to
	// be exchanged when the identity's claimMatch names none (default the
	// simulator issuer's host name, as upstream defaults to its issuer's).
	ExternalTokenAudience string
	// IssuerClient fetches external issuers' discovery documents and keys
	// during token exchange (default: a client with a 10s timeout).
	IssuerClient *http.Client
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
	// DateTags, EpochTags and ReferrerTags add per repo that many tags of
	// the families the tag list hides by default (named like
	// latest-20250301, 1.0.3-r3 and sha256-<hex>.sig), each with
	// HistoryPerTag records.
	DateTags, EpochTags, ReferrerTags int
	// Realistic draws each repo's tag count from a heavy-tailed
	// distribution whose mean is TagsPerRepo (most repos have a few dozen,
	// a few have thousands), three in ten of them versions, four dates and
	// three epochs, and gives most tags one or two history records
	// (HistoryPerTag is then unused; HeavyTags still apply).
	Realistic bool `json:"realistic,omitempty"`
	// NestedRepos puts that many of the Repos below subgroups of the root
	// group (charts, tools, platform), alternately one and two levels down
	// (charts/cert-manager, charts/stable/etcd), so their registry paths
	// are chains of names.
	NestedRepos int
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

	mu     versionedRWMutex
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
	minted        map[string]mintedToken // tokens minted by the sim, any audience

	// Ordered indexes, so the seeded scenario picks the same resources on
	// every run (map iteration order is random).
	repoList []*repo
	tagList  []*tag
	advList  []*advisory

	stats       stats
	faults      faultSet
	oidcKey     oidcKey
	externalKey oidcKey // the built-in external issuer's, a separate key
	events      delivery
	ranked      rankedListings // rankings of listings under way (paginateCached)
	// atPath remembers the repo last found at each registry path
	// (repoByPathLocked), checked again at every use: a path lookup
	// scanned every repo: a fifth of the simulator's CPU in a
	// latency-bound sync of 1,000 repos.
	atPath sync.Map // string → *repo
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
	if opts.Strict {
		opts.EnforceAudiences, opts.HideTagFamilies, opts.UpdatedSinceExclusive = true, true, true
		opts.ProtoJSON, opts.CivilPushTime = true, true
	}
	if opts.Rates == (Rates{}) {
		opts.Rates = DefaultRates()
		if opts.Strict {
			opts.Rates = StrictRates()
		}
	}
	if opts.ExchangeTokenTTL == 0 {
		opts.ExchangeTokenTTL = time.Hour
	}
	if opts.IssuerClient == nil {
		opts.IssuerClient = &http.Client{Timeout: 10 * time.Second}
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
			description: "Full access to the organization, including IAM",
			capabilities: []string{
				"groups.create",
				"groups.delete",
				"identity.create",
				"identity.delete",
				"role_bindings.create",
			}},
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
