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
// advisory updates) weighted by Options.Rates; Run does so on a ticker; Apply
// and MoveTag make one chosen mutation. Truth returns a deep copy of the
// data for tests to compare a mirror with. ScaleScenario is the benchmark
// organization (1,000 repos, 50,000 tags, about 1,000,000 history records,
// 20,000 advisories); it generates in well under a second and about 65 MiB.
//
// # Time
//
// The simulator's time is Options.Clock (default time.Now) plus an offset
// moved by Advance. Resource timestamps, page token expiry (3 days), registry
// token expiry (Options.RegistryTokenTTL) and event and JWT times use it.
// Latency, stalls, Retry-After and delivery backoff are real time, since the
// client waits in real time.
//
// # Served endpoints
//
// Platform API, needing "Authorization: Bearer <token>" with a token from
// Options.Tokens or MintToken (missing or unknown: 401, code 16):
//
//	GET    /registry/v2/repos                      list (uidp.*, name, paging, order_by)
//	GET    /registry/v2/repos/{uid}                PATCH (updateMask, "*"), DELETE (cascades tags)
//	POST   /registry/v2/repos/{parent_group_uid}   create
//	GET    /registry/v2/repos/{uid}/readme
//	GET    /registry/v2/repos/{uid}/digests/{digest}/architectures
//	GET    /registry/v2/repos/{uid}/digests/{digest}/size?architecture=amd64
//	GET    /registry/v2/tags                       list (+ digest, updated_since)
//	GET    /registry/v2/tags/{uid}                 DELETE
//	POST   /registry/v2/tags/{repo_uid}            create (name, digest)
//	GET    /vulnerabilities/v2/advisories          list (+ artifactNames, advisoryIds)
//	GET    /vulnerabilities/v2/advisories/{uid}
//	GET    /iam/v2/groups, /iam/v2/groups/{uid}    PATCH, DELETE (RESOURCE_NOT_EMPTY)
//	POST   /iam/v2/groups/{parent_group_uid}
//	GET    /iam/v2/identities, /{uid}              PATCH, DELETE
//	POST   /iam/v2/identities/{parent_group_uid}   name must match ^[a-z0-9 ._-]{1,}$
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
//	GET /token?scope=repository:<org>/<image>:pull   {"token": "..."}
//	GET /v2/<org>/<image>/_<vendor>/history/<tag>?start=&end=
//
// A registry token names one image. A platform token scoped to the root
// group gets one for the organization's images; anonymous callers get one
// only for Options.PublicOrg images, valid for tags latest and latest-dev.
// The history endpoint answers 401 without a token, 403 for a token of
// another audience (a platform token, an OIDC token) or another image, and at
// most 1000 records oldest first bounded by start and end, whose
// inclusiveness is Options.StartInclusive and Options.EndInclusive.
//
// OIDC issuer: GET /.well-known/openid-configuration and
// /.well-known/jwks.json (RS256).
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
// (fixed, uniform jitter, exponential), 500/502/503, 429 with Retry-After in
// seconds or as an HTTP-date, connection resets, truncated bodies and
// stalled bodies, each at a rate, optionally for the next N requests only.
// Decisions come from a generator seeded by Options.Seed.
//
// # Control API
//
// Under /_sim/, without authentication (meant for loopback tests and demos):
//
//	GET    /_sim/clock             {"now": ...}
//	POST   /_sim/advance           {"duration": "72h"}
//	POST   /_sim/step              {"n": 10} -> {"mutations": [...]}
//	POST   /_sim/mutations         a Mutation, e.g. {"kind":"tag.moved","uid":...,"digest":...}
//	POST   /_sim/populate          a Scale
//	PUT    /_sim/rates             a Rates
//	GET    /_sim/truth             the Truth as JSON
//	GET    /_sim/stats             request counts by endpoint; DELETE resets them
//	POST   /_sim/tokens            {"identity": uid or ""} -> {"token": ...}
//	GET    /_sim/faults            PUT {"faults": [...]} with durations as "250ms"; DELETE clears
//	PUT    /_sim/delivery-faults   {"duplicateRate":..,"reorderRate":..,"dropRate":..,"reorderDelay":"200ms"}
//	GET    /_sim/deliveries        the delivery log
//
// Tokens are never logged; the simulator does not log at all.
package platformsim
