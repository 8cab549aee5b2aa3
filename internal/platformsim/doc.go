// Package platformsim simulates the vendor container platform's API v2 and
// its registry's tag history API, following platform-api-v2.md and, where
// that spec says "not shown", upstream-facts.md. Every test, benchmark and
// the demo of syncd run against it because the real platform cannot be
// reached from build machines. It shares no code with internal/platform on
// purpose: two independent readings of the spec keep each other honest.
//
// # Using it
//
//	sim := platformsim.New(platformsim.Options{Seed: 1, Tokens: []string{"tok"}})
//	sim.Populate(platformsim.Scale{Repos: 20, TagsPerRepo: 5, HistoryPerTag: 10, Advisories: 50})
//	srv := httptest.NewServer(sim.Handler())
//	sim.SetBaseURL(srv.URL) // OIDC issuer and CloudEvents source
//	defer sim.Close()       // stops event delivery
//
// New creates the organization's root group (Options.RootGroup, default
// "org1") and the built-in roles (viewer, editor, owner, registry.pull,
// registry.push). Populate generates repos, tags with history (oldest first;
// a tag's digest is its newest record's), advisories and a few public images
// deterministically from Options.Seed. Step applies seeded mutations (tag
// moves, deprecations, tag and repo creation and deletion, repo and
// advisory updates, advisory withdrawals and deletions) weighted by
// Options.Rates; Run does so on a ticker; Apply
// and MoveTag make one chosen mutation. Truth returns a deep copy of the
// data for tests to compare a mirror with (repos with their registry paths,
// tags with their family, advisories with their deleteTime, groups).
// Scale.NestedRepos puts repos below subgroups (charts, charts/stable, ...),
// and Scale.DateTags, EpochTags and ReferrerTags add per repo tags of the
// families the tag list hides, each with history; all default to 0, so
// existing scales generate what they always did. ScaleScenario is the benchmark
// organization (1,000 repos, 50,000 tags, about 1,000,000 history records,
// 20,000 advisories); it generates in well under a second and about 100 MiB.
//
// # Strict: what the real service does
//
// The simulator was first written from platform-api-v2.md alone. The
// vendor's public code shows more (upstream-facts.md, last section), and
// Options.Strict turns all of it on at once; each part also has its own
// option, and none is on by default, so existing users see no change:
//
//   - EnforceAudiences: a platform API token at the registry's /token
//     answers 403 (OCI body saying the token's audience is not the
//     registry's). The registry wants a registry-audience credential:
//     Options.RegistryTokens, MintTokenFor(uid, AudienceRegistry), or one
//     exchanged at /sts/exchange. In every mode a registry credential is
//     refused by the platform API (401, AIP-193), a platform token by the
//     history endpoint (403), and an expired token with 401.
//   - HideTagFamilies: GET /registry/v2/tags leaves out tags named
//     sha256-* (referrers), *-20yymmdd (dates) and *-r<N> (epochs) unless
//     include_referrers, include_dates or include_epochs (or the camelCase
//     spellings) is true; TagFamily names a tag's family. Get by uid and
//     push events are unaffected.
//   - UpdatedSinceExclusive: the tag list's updated_since keeps only tags
//     updated after the timestamp (the proto's wording); without it, at or
//     after.
//   - ProtoJSON: resources are rendered as the gateway's protojson: fields at
//     their zero value (false, "", [], 0) omitted, int64 as strings,
//     timestamps with 0 (whole seconds), 3, 6 or 9 fractional digits chosen
//     per resource (the values are those of the Truth), enums in full
//     (CATALOG_TIER_BASE), tags without createTime, subscriptions as {uid,
//     sink}, and fields no client knows added: FutureField on every
//     resource, list envelope, tag history answer and record, and on some
//     repos sync_config and customOverlay.
//   - CivilPushTime: a push event's `when` is a date-time without a zone.
//
// PushRepositoryUID (not part of Strict) puts the repo's uid in a push
// event's `repository` instead of its registry path. StrictRates, the
// default Rates of a strict simulator, adds advisory withdrawals and
// lifecycles.
//
// Repos may sit below subgroups. A repo's registry path is the names of
// its uid's segments below the root group joined by "/" (charts/etcd for
// repo org1/<g>/<r> under group "charts"), computed at each request, so
// renaming a group moves its repos. History is served at
// /v2/<org>/<path>/_<vendor>/history/<tag>, registry token scopes name
// <org>/<path>, a path naming no repo answers 404 NAME_UNKNOWN (a missing
// tag of a known repo 404 MANIFEST_UNKNOWN), and push events name the path.
// RegistryPath and TruthRepo.Path give it.
//
// Advisories are whole, as advisories.proto has them: artifact (name, type,
// architecture), component (name, location, type), author, aliases (a CVE,
// often shared by several artifacts, and sometimes a GHSA id), an optional
// legacyAdvisoryId, CVSS v2/v3.1/v4 severities, and a lifecycle of events,
// each carrying one member of the proto's oneof as the gateway renders it
// ({"fixed": {"fixedVersion": ...}}; an empty message is {} in every mode):
// a detection (by a scan, with its match and base64 findings, the NVD API
// or by hand), then true or false positive determinations, a fix pending
// upstream, analysis or a fix not planned, patched or fixed at a version,
// each with its uid (a child of the advisory's), author and review state.
// Without ProtoJSON every field is rendered, zero values included, as a
// gateway emitting unpopulated fields does; optional fields (deleteTime,
// legacyAdvisoryId, issue) are absent when unset in either mode. Populate
// gives each advisory a lifecycle of one to four steps, the last one
// pending review now and then; details are drawn from a generator seeded by
// the advisory's uid, so the rest of a population is what it always was.
// The list filters on advisory_ids, legacy_advisory_ids, artifact_names,
// artifact_types, artifact_architectures, component_names, component_types,
// component_locations, aliases, event_types and latest_event_type
// (EventTypeFilter names or numbers; the latest approved event),
// event_review_states, event_authors, event_reviewers,
// exclude_event_authors and query (in either spelling). Mutations:
// advisory.event appends a step (Mutation.Event, Version, Review),
// advisory.reviewed approves a pending one, advisory.withdrawn sets
// deleteTime (the advisory stays listed and gettable), advisory.deleted
// removes one outright; Rates.AdvanceAdvisory (in StrictRates) moves random
// advisories along realistic lifecycles (detected, then fixed at a version,
// a false positive, pending upstream, ...).
//
// # Token exchange
//
// POST (form body) or GET (query) <base>/sts/exchange with fields aud
// (repeated or comma-separated: APIAudience, default the base URL, and/or
// RegistryAudience, default the base URL's host[:port]), identity (the uid
// to assume) and optional scope/scopes/cap (ignored), and
// "Authorization: Bearer <external OIDC token>". The identity must exist
// (404), its claimMatch issuer and subject must equal the token's iss and
// sub (403), the token's signature must verify with the keys its issuer
// publishes, fetched over HTTP from <iss>/.well-known/openid-configuration
// and its jwks_uri (401; Options.IssuerClient), it must not be expired in
// simulator time (401), and its aud must hold claimMatch.audience, by
// default Options.ExternalTokenAudience or the simulator's host name (403).
// Refusals are AIP-193 bodies naming what did not match, never the token.
// The answer is {"token", "refreshToken", "expiry"}: a JWT from the
// simulator's issuer for the requested audiences, acting as the identity
// (scoped to its parent group; only root-group identities reach the
// registry), valid for Options.ExchangeTokenTTL (default 1h) of simulator
// time, so Advance expires it. Stats.Exchanges counts successes; the
// refresh endpoint is not simulated.
//
// A built-in external issuer stands in for a Kubernetes cluster or a CI
// system: ExternalIssuer() (<base>/_sim/external, with its own discovery
// document and key) and ExternalToken(subject, audience, ttl) mint the
// tokens an identity with claimMatch {issuer: ExternalIssuer(), subject}
// may exchange.
//
// # Time
//
// The simulator's time is Options.Clock (default time.Now) plus an offset
// moved by Advance. Resource timestamps, page token expiry (3 days), registry
// token expiry (Options.RegistryTokenTTL), exchanged tokens' expiry, external
// tokens' validity and event and JWT times use it.
// Latency, stalls, Retry-After and delivery backoff are real time, since the
// client waits in real time.
//
// # Served endpoints
//
// Platform API, needing "Authorization: Bearer <token>" with an
// API-audience token from Options.Tokens, MintToken or /sts/exchange
// (missing, unknown, expired or of the registry's audience: 401, code 16):
//
//	GET    /registry/v2/repos                      list (uidp.*, name, paging, order_by)
//	GET    /registry/v2/repos/{uid}                PATCH (updateMask, "*"), DELETE (cascades tags)
//	POST   /registry/v2/repos/{parent_group_uid}   create
//	GET    /registry/v2/repos/{uid}/readme
//	GET    /registry/v2/repos/{uid}/digests/{digest}/architectures
//	GET    /registry/v2/repos/{uid}/digests/{digest}/size?architecture=amd64
//	GET    /registry/v2/tags                       list (+ digest, updated_since, include_referrers,
//	                                               include_dates, include_epochs)
//	GET    /registry/v2/tags/{uid}                 DELETE
//	POST   /registry/v2/tags/{repo_uid}            create (name, digest)
//	GET    /vulnerabilities/v2/advisories          list (+ the proto's filters: artifact_names, aliases,
//	                                               event_types, ...)
//	GET    /vulnerabilities/v2/advisories/{uid}      withdrawn ones carry deleteTime
//	GET    /iam/v2/groups, /iam/v2/groups/{uid}    PATCH, DELETE (RESOURCE_NOT_EMPTY)
//	POST   /iam/v2/groups/{parent_group_uid}
//	GET    /iam/v2/identities, /{uid}              PATCH, DELETE
//	POST   /iam/v2/identities/{parent_group_uid}   name must match ^[a-z0-9 ._-]{1,}$;
//	                                               claimMatch {issuer, subject, audience}
//	GET    /iam/v2/roles, /iam/v2/roles/{uid}
//	GET    /iam/v2/roleBindings, /{uid}            DELETE; responses hydrated
//	POST   /iam/v2/roleBindings/{parent_group_uid} identityUid, roleUid
//	GET    /events/v2/subscriptions, /{uid}        DELETE
//	POST   /events/v2/subscriptions/{parent_group_uid}  sink (https://, or http:// with AllowHTTPSinks)
//	GET    /ping/v2/ping
//
// List rules: page_size defaults to 50, is coerced to 200 above that and
// rejected when negative; order_by takes name, uid, create_time (created_at,
// createTime), update_time, optionally " desc", default uid ascending, and
// rejects other fields; skip is echoed in skipped; totalCount is a string;
// every parameter is accepted in snake_case and camelCase. Page tokens are
// keyset cursors (base64url JSON of the last item's sort key and uid, the
// query's fingerprint and the issue time): stable under inserts and deletes,
// rejected for a different query, and after 3 days of simulator time they
// silently restart the listing. Errors are AIP-193 bodies with ErrorInfo,
// BadRequest, PreconditionFailure or ResourceInfo details.
//
// Registry, on the same handler, answering OCI-style error bodies:
//
//	GET /token?scope=repository:<org>/<path>:pull   {"token": "..."}
//	GET /v2/<org>/<path>/_<vendor>/history/<tag>?start=&end=
//
// /token takes a credential as "Authorization: Bearer <token>" or as Basic
// auth with the token as password (the vendor's clients send user
// "_token"), and returns a per-image token naming one image: a
// registry-audience credential scoped to the root group gets one for the
// organization's images (a platform token does too unless
// EnforceAudiences); anonymous callers get one only for Options.PublicOrg
// images, valid for tags latest and latest-dev. A per-image token expires
// after Options.RegistryTokenTTL and never after its credential. The history
// endpoint takes a per-image token or a registry-audience credential
// directly; it answers 401 without a token or with an expired one, 403 for
// a token of another audience (a platform token, an OIDC token), another
// image or another organization, and at most 1000 records oldest first
// bounded by start and end, whose inclusiveness is Options.StartInclusive
// and Options.EndInclusive.
//
// OIDC issuer: GET /.well-known/openid-configuration and
// /.well-known/jwks.json (RS256), and POST or GET /sts/exchange.
//
// # Events
//
// Every change made through the API or the scenario engine is sent to each
// subscription whose group contains the resource: an HTTP POST in
// CloudEvents 1.0 binary mode (Ce-Id, Ce-Type, Ce-Source, Ce-Subject, Ce-Time,
// Ce-Group, Ce-Audience), body {"actor": ..., "body": ...}, and
// "Authorization: Bearer <JWT>" with iss the simulator, aud "customer", sub
// "webhook:<group uid>" and webhook.digest the body's sha256. Tag moves and
// creations send dev.<vendor>.registry.push.v1 with the repo uid as subject;
// deprecations and advisory changes send nothing, as upstream, so only a
// crawl sees them. Non-2xx answers are retried with exponential backoff
// (Options.DeliveryBackoff, DeliveryMaxBackoff, DeliveryAttempts).
// SetDeliveryFaults duplicates, reorders or drops deliveries; Deliveries
// returns the delivery log.
//
// # Faults
//
// SetFaults installs per-endpoint-pattern faults (patterns as in Stats,
// "GET /registry/v2/tags", with a trailing "*" or "*" alone): added latency
// (fixed, uniform jitter, exponential) or a response time the simulator's
// own work counts toward (RespondAfter), 500/502/503, 429 with Retry-After in
// seconds or as an HTTP-date, connection resets, truncated bodies and
// stalled bodies, each at a rate, optionally for the next N requests only.
// Decisions come from a generator seeded by Options.Seed. A fault can be
// narrowed to a URL path (Fault.Path, trailing "*" allowed) or to one
// registry image (Fault.Image, "<org>/<path>": its history and its /token
// scope), and Fault.Status answers every match with that status and the
// endpoint's error body (OCI for the registry: 404 NAME_UNKNOWN, 403
// DENIED; AIP-193 with the matching code for the platform). AddFaults adds
// faults; RemoveFaults(name) switches the ones called Fault.Name off.
//
// # Control API
//
// Under /_sim/, without authentication (meant for loopback tests and demos):
//
//	GET    /_sim/clock             {"now": ...}
//	POST   /_sim/advance           {"duration": "72h"}
//	POST   /_sim/step              {"n": 10} -> {"mutations": [...]}
//	POST   /_sim/mutations         a Mutation, e.g. {"kind":"tag.moved","uid":...,"digest":...},
//	                               {"kind":"advisory.withdrawn","uid":...}
//	POST   /_sim/populate          a Scale
//	PUT    /_sim/rates             a Rates
//	GET    /_sim/truth             the Truth as JSON
//	GET    /_sim/stats             request counts by endpoint; DELETE resets them
//	POST   /_sim/tokens            {"identity": uid or "", "audience": "api" (default) or "registry"} -> {"token": ...}
//	POST   /_sim/external-token    {"subject": ..., "audience": ..., "ttl": "10m"} -> {"token": ...}
//	GET    /_sim/external/.well-known/openid-configuration, /_sim/external/jwks   the external issuer
//	GET    /_sim/faults            PUT {"faults": [...]} replaces, POST adds, with durations as "250ms";
//	                               DELETE clears, DELETE ?name=N removes the faults called N
//	PUT    /_sim/delivery-faults   {"duplicateRate":..,"reorderRate":..,"dropRate":..,"reorderDelay":"200ms"}
//	GET    /_sim/deliveries        the delivery log
//
// Tokens are never logged; the simulator does not log at all.
package platformsim
