package publish

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/store"
)

// This file keeps the current state of the mirror in JetStream KV buckets
// beside the stream, for consumers that ask "what is nginx:1.27 now"
// rather than replay the stream: tags, repos and advisories, one key
// each, written by the relay after the event that set the state was
// acknowledged and marked published, and a KV delete (a tombstone that
// watchers see) when the resource is deleted upstream.
//
// Writes follow the marking, not the acknowledgement, so that the buckets
// never hold a state the outbox does not count as published. A crash
// between the marking and the write loses a write; the relay therefore
// reconciles the buckets with the mirror (store.PublishedState) when it
// starts, after a failed write, when the baseline ends, and every
// ReconcileInterval. The reconciliation writes each resource's newest
// published state and deletes keys of resources that are not live, so it
// can never put an older state over a newer one: no write of a later
// event can have happened (the relay that would write it is the one
// reconciling, and it has not published it yet).

// KVConfig names and sizes the buckets.
type KVConfig struct {
	Tags       string // bucket of tags: <repo path>.<tag>
	Repos      string // bucket of repos: <repo path>
	Advisories string // bucket of advisories: <advisory id>
	// Matured is the bucket of matured digests, <repo path>.<tag>.<age>;
	// empty: none (maturity is off).
	Matured string
	// History is how many values the buckets keep per key (1 to 64).
	History int
	// Replicas of each bucket's stream; 0 means 1.
	Replicas int
	// CheckOnly binds to buckets that must exist already, for an account
	// that may not create streams (nats.manage_stream = false).
	CheckOnly bool
	// ReconcileInterval, when positive, reconciles the buckets with the
	// mirror that often, which brings in what changed without an event
	// (a repo whose baseline was pending).
	ReconcileInterval time.Duration
	// InFlight bounds the writes awaiting JetStream's acknowledgement;
	// 0 means DefaultKVInFlight.
	InFlight int
	// Queue bounds the marked events waiting for their writes; 0 means
	// DefaultKVQueue. When it is full the relay's marking waits for the
	// writer to take the queue, up to a few seconds; past that (the
	// buckets do not answer) the relay drops the writes and reconciles the
	// buckets instead.
	Queue  int
	Logger *slog.Logger
}

// Defaults of the KV writes. A write is a JetStream publish to the key's
// subject, sent without waiting for the previous one's acknowledgement;
// one connection's messages to one subject are stored in the order they
// were sent, so a key's writes keep their order however many are in
// flight. The queue holds a few of the relay's marking transactions
// (markBatch events each), enough to ride out a burst.
const (
	DefaultKVInFlight = 1024
	DefaultKVQueue    = 8 * markBatch
)

// kvQueueWait is how long the marking waits for room in a full queue
// before it drops the writes. A writer that is merely slower than the
// relay (each event is a second JetStream message, on the same
// connection) takes a full queue within a fraction of a second; dropping
// then cost a reconciliation of every key, seconds at 71,000 keys, where
// pacing the relay to the writer costs nothing: Flush waits for the
// writes anyway. Well under stallAfter, so that a pass held up by a
// stalled bucket is not reported as a stalled relay.
const kvQueueWait = 2 * time.Second

// KVSource is what reconciling the buckets needs of the store.
type KVSource interface {
	PublishedState(ctx context.Context, fn func(store.PublishedResource) error) error
	LatestEventIDs(ctx context.Context, subjects []string) (map[string]string, error)
	KVEpoch(ctx context.Context) (string, error)
	MaturedDigests(ctx context.Context, fn func(store.MaturedTag) error) error
}

// KV writes the state buckets.
type KV struct {
	buckets map[string]jetstream.KeyValue // by kind: tag, repo, advisory, matured
	// prefix is the subject prefix of a bucket's keys, by kind, as the
	// client's Put builds it: $KV.<bucket>.
	prefix map[string]string
	// local is the subject prefix of a bucket's keys, by kind, in the
	// stream that stores them: prefix without another domain's API prefix.
	local map[string]string
	// fence, when set, stamps every write with the lease term (fence.go);
	// lanes spreads the writes over its lanes from one pipe to the next,
	// and left holds the writes a cancelled pipe left in flight, which the
	// next waits for.
	fence *Fence
	lanes *Pipeline
	left  leftInFlight
	// pub sends the writes; a JetStream context of its own, so that its
	// pending writes never count against the relay's publishes.
	pub      jetstream.JetStream
	source   KVSource
	cfg      KVConfig
	log      *slog.Logger
	inFlight int
	queue    int
	// queueWait is how long a marking waits for room in the writer's
	// queue: kvQueueWait, or 0 in a test that has a full queue drop.
	queueWait time.Duration
	// dirty: the buckets may lag the published events; reconcile. Set by
	// the writer of a pass, read by the relay between and during passes.
	dirty    atomic.Bool
	epoch    string // the source's KVEpoch at the last reconciliation
	lastSync time.Time
	// beforeApply, when set, runs before the writes of marked events; an
	// error stops them (a test's crash point).
	beforeApply func([]store.Event) error
	// acked is the highest stream sequence a write of each bucket (by
	// kind) was acknowledged at: a bucket whose stream gives one of them
	// again lost its last writes (see gaveAgain).
	ackedMu sync.Mutex
	acked   map[string]uint64
	// lostWrites is set with dirty when a bucket gave a sequence again:
	// the relay reconciles at once, not at its next pass; losses counts
	// those findings.
	lostWrites atomic.Bool
	losses     atomic.Int64
}

// ReconcileStats counts what a reconciliation changed.
type ReconcileStats struct {
	Put, Deleted, Unchanged int
}

// OpenKV creates or updates the buckets (binds to them when
// cfg.CheckOnly) and returns their writer, which reconciles them at its
// first use.
func OpenKV(ctx context.Context, js jetstream.JetStream, cfg KVConfig, source KVSource) (*KV, error) {
	k := &KV{
		buckets:   map[string]jetstream.KeyValue{},
		prefix:    map[string]string{},
		local:     map[string]string{},
		source:    source,
		cfg:       cfg,
		log:       cfg.Logger,
		inFlight:  cfg.InFlight,
		queue:     cfg.Queue,
		queueWait: kvQueueWait,
	}
	k.dirty.Store(true)
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	if k.inFlight <= 0 {
		k.inFlight = DefaultKVInFlight
	}
	if k.queue <= 0 {
		k.queue = DefaultKVQueue
	}
	pub, err := jetstream.New(
		js.Conn(),
		jetstream.WithPublishAsyncMaxPending(2*k.inFlight),
		jetstream.WithPublishAsyncTimeout(30*time.Second),
	)
	if err != nil {
		return nil, fmt.Errorf("open KV buckets: %w", err)
	}
	k.pub = pub
	for _, b := range k.bucketList() {
		if b.name == "" && b.kind == "matured" {
			continue
		}
		if err := k.open(ctx, js, b); err != nil {
			return nil, err
		}
	}
	return k, nil
}

// bucket is one of the KV buckets: its kind, name and what it holds.
type bucket struct{ kind, name, what string }

func (k *KV) bucketList() []bucket {
	return []bucket{
		{"tag", k.cfg.Tags, "tags: <repo path>.<tag>"},
		{"repo", k.cfg.Repos, "repos: <repo path>"},
		{"advisory", k.cfg.Advisories, "advisories: <advisory id>"},
		{"matured", k.cfg.Matured, "matured digests: <repo path>.<tag>.<age>"},
	}
}

// open creates or updates the bucket b (binds to it when cfg.CheckOnly).
func (k *KV) open(ctx context.Context, js jetstream.JetStream, b bucket) error {
	var kv jetstream.KeyValue
	var err error
	if k.cfg.CheckOnly {
		kv, err = js.KeyValue(ctx, b.name)
	} else {
		kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
			Bucket: b.name, Description: "syncd current state of " + b.what,
			History: uint8(max(k.cfg.History, 1)), Replicas: max(k.cfg.Replicas, 1), Storage: jetstream.FileStorage,
		})
	}
	if err != nil {
		return fmt.Errorf("open KV bucket %s: %w", b.name, err)
	}
	k.buckets[b.kind] = kv
	if k.prefix[b.kind], k.local[b.kind], err = keyPrefix(ctx, kv); err != nil {
		return fmt.Errorf("open KV bucket %s: %w", b.name, err)
	}
	return nil
}

// remake makes the bucket of kind again if it is gone (NATS can lose a
// stream whole, and a bucket is one; an operator can delete it), after
// its read by the reconciliation failed with failed; it reports whether
// it did. With cfg.CheckOnly (manage_stream = false) it only says so.
func (k *KV) remake(ctx context.Context, kind string, failed error) (bool, error) {
	// Only a read that found no stream is looked into: one that stalled
	// (the server unreachable) would stall the lookup too.
	if !errors.Is(failed, jetstream.ErrStreamNotFound) && !errors.Is(failed, nats.ErrStreamNotFound) &&
		!errors.Is(failed, jetstream.ErrBucketNotFound) {
		return false, nil
	}
	name := k.buckets[kind].Bucket()
	lctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := k.pub.KeyValue(lctx, name); !errors.Is(err, jetstream.ErrBucketNotFound) {
		return false, nil // there, or not answering: the read's failure stands
	}
	if k.cfg.CheckOnly {
		return false, fmt.Errorf(
			"KV bucket %s is gone, and nats.manage_stream = false forbids syncd to create it: create it again: %w",
			name, failed)
	}
	for _, b := range k.bucketList() {
		if b.kind == kind {
			if err := k.open(ctx, k.pub, b); err != nil {
				return false, err
			}
		}
	}
	k.forgetAcked(kind)
	k.log.Warn("KV bucket was gone (lost by NATS, or deleted); made it again: reconciling writes it every key",
		"bucket", name)
	return true, nil
}

// TagValue is a tag's value in the tags bucket.
type TagValue struct {
	Repo       string    `json:"repo"` // the repo's registry path
	Tag        string    `json:"tag"`
	UID        string    `json:"uid"`
	Digest     string    `json:"digest"`
	Deprecated bool      `json:"deprecated"`
	UpdateTime time.Time `json:"updateTime,omitzero"`
	// EventID is the id of the event that set this state; empty for a
	// state the baseline found without an event, or whose event was pruned.
	EventID string `json:"eventId"`
}

// RepoValue is a repo's value in the repos bucket: the repo as events
// carry it, and the id of the event that set it.
type RepoValue struct {
	store.Repo
	EventID string `json:"eventId"`
}

// AdvisoryValue is an advisory's value in the advisories bucket: what it
// is about, its aliases, and its current lifecycle state.
type AdvisoryValue struct {
	AdvisoryID   string   `json:"advisoryId"`
	UID          string   `json:"uid"`
	ArtifactName string   `json:"artifactName"`
	ArtifactType string   `json:"artifactType,omitempty"`
	Component    string   `json:"componentName,omitempty"`
	Aliases      []string `json:"aliases,omitempty"`
	// State is the latest lifecycle step that counts (approved, or without
	// a review state): detected, fixed, false_positive, ...; empty: none.
	State        string    `json:"state"`
	StateTime    time.Time `json:"stateTime,omitzero"`
	FixedVersion string    `json:"fixedVersion,omitempty"`
	UpdateTime   time.Time `json:"updateTime,omitzero"`
	EventID      string    `json:"eventId"`
}

// MaturedValue is a tag's matured digest for an age in the matured
// bucket (docs/events.md, tag.matured).
type MaturedValue struct {
	Repo   string `json:"repo"` // the repo's registry path
	Tag    string `json:"tag"`
	UID    string `json:"uid"`
	Age    string `json:"age"`
	Digest string `json:"digest"`
	// Since is when the tag moved to Digest; MaturedTime when Digest had
	// stayed on it for Age.
	Since       time.Time `json:"since"`
	MaturedTime time.Time `json:"maturedTime,omitzero"`
	// EventID is the id of the tag.matured event that set this state.
	EventID string `json:"eventId"`
}

// maturedOp is the put of a matured digest.
func maturedOp(d store.MaturedTag, eventID string) (kvOp, error) {
	b, err := json.Marshal(MaturedValue{Repo: d.Repo, Tag: d.Tag, UID: d.UID, Age: d.Age, Digest: d.Digest,
		Since: d.Since.UTC(), MaturedTime: d.MaturedTime.UTC(), EventID: eventID})
	return kvOp{kind: "matured", key: MaturedKey(d.Repo, d.Tag, d.Age), value: b, subject: d.UID}, err
}

func tagValue(t store.Tag, path, eventID string) TagValue {
	if path == "" {
		path = t.Path
	}
	return TagValue{
		Repo:       path,
		Tag:        t.Name,
		UID:        t.UID,
		Digest:     t.Digest,
		Deprecated: t.Deprecated,
		UpdateTime: t.UpdateTime.UTC(),
		EventID:    eventID,
	}
}

func advisoryValue(a store.Advisory, eventID string) AdvisoryValue {
	v := AdvisoryValue{AdvisoryID: a.AdvisoryID, UID: a.UID, ArtifactName: a.ArtifactName, ArtifactType: a.ArtifactType,
		Component: a.ComponentName, Aliases: a.Aliases, UpdateTime: a.UpdateTime.UTC(), EventID: eventID}
	if s, ok := a.State(); ok {
		v.State, v.StateTime, v.FixedVersion = s.Type, s.CreateTime.UTC(), s.FixedVersion
	}
	return v
}

// kvOp is one write: a put of value, or a delete when value is nil.
type kvOp struct {
	kind    string // bucket: tag, repo, advisory
	key     string
	value   []byte
	subject string // the resource's uid, for reconciling
	// res is the resource whose state value holds, when reconciling.
	res *store.PublishedResource
}

// opsOf returns the writes an event makes: a put of its "after", a delete
// of its "before" when the resource is gone or moved to another key. The
// data is decoded once, the "after" straight into the resource's type and
// of the "before" only its key: the writer does this for every event the
// relay publishes.
func opsOf(e store.Event) ([]kvOp, error) {
	if e.Type == store.TagMatured {
		var d store.MaturedTag
		if err := json.Unmarshal(e.Data, &d); err != nil {
			return nil, fmt.Errorf("decode data of %s %s: %w", e.Type, e.ID, err)
		}
		op, err := maturedOp(d, e.ID)
		return []kvOp{op}, err
	}
	if !statefulType(e.Resource, e.Action) {
		return nil, nil
	}
	var before, after store.PublishedResource
	var err error
	switch e.Resource {
	case "tag":
		var d states[tagAfter]
		if err = json.Unmarshal(e.Data, &d); err == nil && d.Before != nil {
			before.Tag = &store.Tag{Name: d.Before.Name, Path: d.Before.Path}
		}
		if d.After != nil {
			after.Tag = d.After.tag()
		}
	case "repo":
		var d states[store.Repo]
		if err = json.Unmarshal(e.Data, &d); err == nil && d.Before != nil {
			before.Repo = &store.Repo{Name: d.Before.Name, Path: d.Before.Path}
		}
		after.Repo = d.After
	case "advisory":
		var d states[advisoryAfter]
		if err = json.Unmarshal(e.Data, &d); err == nil && d.Before != nil {
			before.Advisory = &store.Advisory{AdvisoryID: d.Before.AdvisoryID}
		}
		if d.After != nil {
			after.Advisory = d.After.advisory()
		}
	default:
		err = fmt.Errorf("unknown resource %q", e.Resource)
	}
	if err != nil {
		return nil, fmt.Errorf("decode data of %s %s: %w", e.Type, e.ID, err)
	}
	return writesOf(e, before, after)
}

// writesOf returns the writes of e, whose resource was before and is
// after it: a put of after, and a delete of before's key when the
// resource is gone or moved to another key.
func writesOf(e store.Event, before, after store.PublishedResource) ([]kvOp, error) {
	var ops []kvOp
	var put *kvOp
	if isSet(after) {
		var err error
		if put, err = putOp(after, e.Scope, e.ID); err != nil {
			return nil, fmt.Errorf("event %s %s: %w", e.Type, e.ID, err)
		}
	}
	if isSet(before) {
		kind, key := keyOf(before, e.Scope)
		if put == nil || put.key != key {
			ops = append(ops, kvOp{kind: kind, key: key, subject: e.Subject})
		}
	}
	if put != nil {
		ops = append(ops, *put)
	}
	return ops, nil
}

func isSet(r store.PublishedResource) bool { return r.Tag != nil || r.Repo != nil || r.Advisory != nil }

// states is an event's data: the resource before and after it. Of the
// state before, only what names the key is decoded.
type states[T any] struct {
	Before *keyFields `json:"before"`
	After  *T         `json:"after"`
}

// tagAfter is what a tag's value (tagValue) and key take from the tag an
// event carries. Decoding only these spares the writer the rest (a time,
// the repo's uid and name, bundles): the writer decodes every event the
// relay publishes, beside it on the same cores.
type tagAfter struct {
	UID        string    `json:"uid"`
	Path       string    `json:"path"`
	Name       string    `json:"name"`
	Digest     string    `json:"digest"`
	Deprecated bool      `json:"deprecated"`
	UpdateTime time.Time `json:"updateTime"`
}

func (t *tagAfter) tag() *store.Tag {
	return &store.Tag{UID: t.UID, Path: t.Path, Name: t.Name, Digest: t.Digest, Deprecated: t.Deprecated,
		UpdateTime: t.UpdateTime}
}

// advisoryAfter is what an advisory's value (advisoryValue) and key take
// from the advisory an event carries: not its severities, nor its steps'
// authors, notes, findings and details, most of its size.
type advisoryAfter struct {
	UID           string    `json:"uid"`
	AdvisoryID    string    `json:"advisoryId"`
	ArtifactName  string    `json:"artifactName"`
	ArtifactType  string    `json:"artifactType"`
	ComponentName string    `json:"componentName"`
	Aliases       []string  `json:"aliases"`
	UpdateTime    time.Time `json:"updateTime"`
	Events        []struct {
		Type         string    `json:"type"`
		CreateTime   time.Time `json:"createTime"`
		ReviewState  string    `json:"reviewState"`
		FixedVersion string    `json:"fixedVersion"`
	} `json:"events"`
}

func (a *advisoryAfter) advisory() *store.Advisory {
	out := &store.Advisory{UID: a.UID, AdvisoryID: a.AdvisoryID, ArtifactName: a.ArtifactName,
		ArtifactType: a.ArtifactType, ComponentName: a.ComponentName, Aliases: a.Aliases, UpdateTime: a.UpdateTime,
		Events: make([]store.AdvisoryEvent, len(a.Events))}
	for i, e := range a.Events {
		out.Events[i] = store.AdvisoryEvent{Type: e.Type, CreateTime: e.CreateTime, ReviewState: e.ReviewState,
			FixedVersion: e.FixedVersion}
	}
	return out
}

// keyFields are the fields of a tag, repo or advisory that its key is
// made of.
type keyFields struct {
	Name       string `json:"name"`
	Path       string `json:"path"`
	AdvisoryID string `json:"advisoryId"`
}

// statefulType reports whether events of this type carry before and after
// (an advisory's lifecycle steps do not; its advisory.updated does).
func statefulType(resource, action string) bool {
	switch resource + "." + action {
	case store.AdvisoryCreated, store.AdvisoryUpdated, store.AdvisoryWithdrawn:
		return true
	}
	return resource == "repo" || (resource == "tag" && action != "matured")
}

// keyOf returns the bucket (by kind) and key of r. A tag's path is scope
// when given (an event's scope is its repo's path).
func keyOf(r store.PublishedResource, scope string) (kind, key string) {
	switch {
	case r.Tag != nil:
		return "tag", TagKey(cmp.Or(scope, r.Tag.Path), r.Tag.Name)
	case r.Repo != nil:
		return "repo", RepoKey(cmp.Or(r.Repo.Path, r.Repo.Name))
	case r.Advisory != nil:
		return "advisory", AdvisoryKey(r.Advisory.AdvisoryID)
	}
	return "", ""
}

// putOp is the put of r's state. A tag's path is scope when given (an
// event's scope is its repo's path).
func putOp(r store.PublishedResource, scope, eventID string) (*kvOp, error) {
	var op kvOp
	var v any
	op.kind, op.key = keyOf(r, scope)
	switch {
	case r.Tag != nil:
		op.subject, v = r.Tag.UID, tagValue(*r.Tag, scope, eventID)
	case r.Repo != nil:
		rv := RepoValue{Repo: *r.Repo, EventID: eventID}
		rv.Path = cmp.Or(rv.Path, rv.Name)
		rv.CreateTime, rv.UpdateTime = rv.CreateTime.UTC(), rv.UpdateTime.UTC()
		op.subject, v = rv.UID, rv
	case r.Advisory != nil:
		op.subject, v = r.Advisory.UID, advisoryValue(*r.Advisory, eventID)
	default:
		return nil, errors.New("empty resource")
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, err
	}
	op.value = b
	return &op, nil
}

// keyPrefix is the subject prefix of kv's keys, as the client's Put
// builds it (kvs.putPre and kvs.pre in nats.go's jetstream/kv.go): a
// bucket that mirrors another is written through the other's subjects;
// local is the prefix in the stream that stores them.
func keyPrefix(ctx context.Context, kv jetstream.KeyValue) (prefix, local string, err error) {
	st, err := kv.Status(ctx)
	if err != nil {
		return "", "", err
	}
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok {
		if m := bs.StreamInfo().Config.Mirror; m != nil {
			origin := strings.TrimPrefix(m.Name, "KV_")
			local = "$KV." + origin + "."
			if m.External != nil && m.External.APIPrefix != "" {
				return m.External.APIPrefix + "." + local, local, nil
			}
			return local, local, nil
		}
	}
	local = "$KV." + kv.Bucket() + "."
	return local, local, nil
}

// setFence has every write of the buckets go through f, and f mark a term
// in each of them (their key TermKey).
func (k *KV) setFence(f *Fence) {
	k.fence, k.lanes = f, f.Pipeline()
	// Every bucket the writer keeps, the matured one included: a write to
	// a bucket without a marker is refused before it is sent.
	for _, kind := range []string{"tag", "repo", "advisory", "matured"} {
		if k.buckets[kind] != nil {
			f.Guard(k.prefix[kind]+TermKey, k.local[kind]+TermKey, "KV_"+k.buckets[kind].Bucket())
		}
	}
}

// message is the JetStream message of o, as the client's Put and Delete
// send it: the value to the key's subject, or a delete marker (header
// KV-Operation: DEL) that watchers see as a delete.
// It is stamped with the fence's term.
func (k *KV) message(o kvOp, lanes *Pipeline) (*nats.Msg, error) {
	m := &nats.Msg{Subject: k.prefix[o.kind] + o.key, Data: o.value}
	if o.value == nil {
		m.Header = nats.Header{"KV-Operation": []string{"DEL"}}
	}
	check := k.local[o.kind] + TermKey
	return m, k.fence.StampLane(m, check, lanes.Lane(check))
}

// write does ops in their order and waits for them. It returns the first
// error.
func (k *KV) write(ctx context.Context, ops []kvOp) error {
	p := k.pipe(ctx)
	for _, o := range ops {
		p.send(ctx, o)
	}
	return p.wait(ctx)
}

// kvPipe sends writes without waiting for each acknowledgement, up to
// limit awaiting theirs (k.inFlight, or fewer as the fence's lanes
// allow), and keeps the first failure.
type kvPipe struct {
	k        *KV
	lanes    *Pipeline
	limit    int
	inflight []kvFlight
	err      error
}

type kvFlight struct {
	op  kvOp
	fut jetstream.PubAckFuture
}

func (k *KV) pipe(ctx context.Context) *kvPipe {
	k.left.drain(ctx)
	limit := k.inFlight
	if d := k.lanes.Depth(); d > 0 {
		limit = min(limit, d)
	}
	return &kvPipe{k: k, lanes: k.lanes, limit: limit}
}

// apply sends the writes of evs, unless a write failed already: the
// first failure most likely meets them all (NATS unreachable), and the
// relay reconciles the buckets after it anyway.
func (p *kvPipe) apply(ctx context.Context, evs []store.Event) {
	if p.err != nil {
		return
	}
	if p.k.beforeApply != nil {
		if err := p.k.beforeApply(evs); err != nil {
			p.err = err
			return
		}
	}
	for _, e := range evs {
		ops, err := opsOf(e)
		if err != nil {
			p.err = err
			return
		}
		for _, o := range ops {
			p.send(ctx, o)
		}
	}
}

// send publishes o, after waiting for the oldest write when k.inFlight
// are in flight; it does nothing once a write failed.
func (p *kvPipe) send(ctx context.Context, o kvOp) {
	if p.k.buckets[o.kind] == nil {
		return // a tag.matured while this replica keeps no matured bucket
	}
	for p.err == nil && len(p.inflight) >= p.limit {
		p.waitOldest(ctx)
	}
	if p.err != nil {
		return
	}
	m, err := p.k.message(o, p.lanes)
	if err != nil {
		p.fail(o, err)
		return
	}
	fut, err := p.k.pub.PublishMsgAsync(m, noRetry...)
	if err != nil {
		p.fail(o, err)
		return
	}
	p.inflight = append(p.inflight, kvFlight{o, fut})
}

// noRetry turns off the client's retry of an async publish that met no
// responders (a stream electing its leader): the retry goes out a while
// later, after the key's next writes, and would put an older state over
// a newer one without an error. A failure instead has the relay
// reconcile the buckets.
var noRetry = []jetstream.PublishOpt{jetstream.WithRetryAttempts(0)}

// oldest returns the channels of the oldest write's answer; nil ones
// when none is in flight.
func (p *kvPipe) oldest() (<-chan *jetstream.PubAck, <-chan error) {
	if len(p.inflight) == 0 {
		return nil, nil
	}
	return p.inflight[0].fut.Ok(), p.inflight[0].fut.Err()
}

// waitOldest waits for the oldest write's answer, or ctx.
func (p *kvPipe) waitOldest(ctx context.Context) {
	ok, failed := p.oldest()
	select {
	case ack := <-ok:
		p.pop(ack, nil)
	case err := <-failed:
		p.pop(nil, err)
	case <-ctx.Done():
		p.err = cmp.Or(p.err, ctx.Err())
	}
}

// pop removes the oldest write, which err (if any) failed. An
// acknowledged write is logged at debug with its bucket's stream sequence:
// which write set a key's value, when a watcher saw it go back.
func (p *kvPipe) pop(ack *jetstream.PubAck, err error) {
	f := p.inflight[0]
	p.inflight[0] = kvFlight{}
	p.inflight = p.inflight[1:]
	if err != nil {
		p.fail(f.op, err, f.fut.Msg())
		return
	}
	if ack != nil && p.k.gaveAgain(f.op.kind, ack) {
		// The writes it lost left their keys as they were before: the
		// buckets lag the published events, and the relay reconciles them
		// as soon as this pass ends.
		p.k.losses.Add(1)
		p.k.dirty.Store(true)
		p.k.lostWrites.Store(true)
		p.k.fence.Doubt(fmt.Sprintf("KV bucket %s stored a write at sequence %d, which it had acknowledged before",
			p.k.buckets[f.op.kind].Bucket(), ack.Sequence))
	}
	if ack != nil && p.k.log.Enabled(context.Background(), slog.LevelDebug) {
		p.k.log.Debug("KV write acknowledged", "kind", f.op.kind, "key", f.op.key, "stream_seq", ack.Sequence,
			"delete", f.op.value == nil, "value", string(f.op.value))
	}
}

// gaveAgain records that a write of the bucket of kind was acknowledged
// at ack's sequence, and reports whether the bucket's stream had
// acknowledged a write at that sequence or a later one before: a stream
// gives every new message a sequence above all before it, unless it lost
// its last messages (a server that restarted without the writes it had
// not synced to disk) and gives their sequences again. A duplicate names
// its first copy's sequence and counts for nothing. It logs the loss once
// at WARN.
func (k *KV) gaveAgain(kind string, ack *jetstream.PubAck) bool {
	if ack.Duplicate {
		return false
	}
	k.ackedMu.Lock()
	defer k.ackedMu.Unlock()
	before := k.acked[kind]
	if k.acked == nil {
		k.acked = map[string]uint64{}
	}
	// Above before: the highest yet. At or below it: the loss, counted
	// from here on, so that it is reported once.
	k.acked[kind] = ack.Sequence
	if ack.Sequence > before {
		return false
	}
	k.log.Warn("a KV bucket's stream lost its last writes (it acknowledged a write at a sequence it had "+
		"acknowledged before): reconciling the buckets", "bucket", k.buckets[kind].Bucket(),
		"stream_seq", ack.Sequence, "acknowledged_before", before)
	return true
}

// forgetAcked forgets the sequences the bucket of kind acknowledged: it
// was made again, and counts from 1.
func (k *KV) forgetAcked(kind string) {
	k.ackedMu.Lock()
	delete(k.acked, kind)
	k.ackedMu.Unlock()
}

func (p *kvPipe) fail(o kvOp, err error, sent ...*nats.Msg) {
	p.k.fence.Check(err, sent...)
	if p.err != nil {
		return
	}
	what := "put " + o.key + " in"
	if o.value == nil {
		what = "delete " + o.key + " from"
	}
	p.err = fmt.Errorf("%s KV bucket %s: %w", what, p.k.buckets[o.kind].Bucket(), err)
}

// wait waits for every write in flight and returns the first failure.
func (p *kvPipe) wait(ctx context.Context) error {
	for len(p.inflight) > 0 && ctx.Err() == nil {
		p.waitOldest(ctx)
	}
	if len(p.inflight) > 0 && p.lanes.Depth() > 0 {
		// Left in flight on lanes: the next pipe waits for them.
		for _, f := range p.inflight {
			p.k.left.add(f.fut)
		}
		p.inflight = nil
	}
	if p.err == nil && ctx.Err() != nil {
		p.err = ctx.Err()
	}
	return p.err
}

// kvWriter writes the state of a relay pass's marked events to the
// buckets in a goroutine of its own, so that neither marking nor (through
// it) publishing waits for each write. Its queue is bounded: when it is
// full, the marking waits for the writer to take it, up to kvQueueWait;
// past that the writes are dropped and the buckets marked dirty, and the
// relay reconciles them before its next pass.
type kvWriter struct {
	k    *KV
	mu   sync.Mutex
	evs  []store.Event // queued
	shut bool          // no more events will come
	drop int           // events dropped because the queue was full
	wake chan struct{}
	// room receives a value when the writer took the queue.
	room chan struct{}
	done chan struct{}
	err  error // the first failure, once done is closed
}

// startWriter starts the writer of one relay pass; close ends it.
func (k *KV) startWriter(ctx context.Context) *kvWriter {
	w := &kvWriter{k: k, wake: make(chan struct{}, 1), room: make(chan struct{}, 1), done: make(chan struct{})}
	go w.run(ctx)
	return w
}

// enqueue queues the writes of evs, which were just marked published, a
// queue's worth at a time. When the queue is full it waits up to
// w.k.queueWait for the writer to take it; it drops the writes, and marks
// the buckets dirty, when that runs out or when the buckets are dirty
// already (the writer skips the writes then).
func (w *kvWriter) enqueue(ctx context.Context, evs []store.Event) {
	for len(evs) > 0 {
		n := min(len(evs), w.k.queue)
		w.enqueueChunk(ctx, evs[:n])
		evs = evs[n:]
	}
}

func (w *kvWriter) enqueueChunk(ctx context.Context, evs []store.Event) {
	var timeout <-chan time.Time
	gaveUp := w.k.queueWait <= 0
	w.mu.Lock()
	for len(w.evs)+len(evs) > w.k.queue && !w.k.dirty.Load() && !gaveUp {
		if timeout == nil {
			t := time.NewTimer(w.k.queueWait)
			defer t.Stop()
			timeout = t.C
		}
		w.mu.Unlock()
		w.signal()
		select {
		case <-w.room:
		case <-w.done: // the pass was cancelled: nothing takes the queue
			gaveUp = true
		case <-timeout:
			gaveUp = true
		case <-ctx.Done():
			gaveUp = true
		}
		w.mu.Lock()
	}
	if len(w.evs)+len(evs) > w.k.queue {
		w.drop += len(evs)
		w.k.dirty.Store(true)
	} else {
		w.evs = append(w.evs, evs...)
	}
	w.mu.Unlock()
	w.signal()
}

func (w *kvWriter) signal() {
	select {
	case w.wake <- struct{}{}:
	default:
	}
}

// take returns what is queued, and whether more may come.
func (w *kvWriter) take() ([]store.Event, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	evs := w.evs
	w.evs = nil
	if len(evs) > 0 {
		select {
		case w.room <- struct{}{}:
		default:
		}
	}
	return evs, !w.shut
}

// close waits for the writes of everything queued, and returns how many
// events' writes it dropped and the first failure.
func (w *kvWriter) close() (dropped int, err error) {
	w.mu.Lock()
	w.shut = true
	w.mu.Unlock()
	w.signal()
	<-w.done
	return w.drop, w.err
}

func (w *kvWriter) run(ctx context.Context) {
	defer close(w.done)
	p := w.k.pipe(ctx)
	for ctx.Err() == nil {
		evs, more := w.take()
		if len(evs) == 0 && !more {
			break
		}
		if len(evs) > 0 {
			if !w.k.dirty.Load() {
				p.apply(ctx, evs) // else a reconciliation writes them
			}
		} else {
			// Take the answers in while idle: a failure marks the buckets
			// dirty at once, and answered writes free their memory.
			ok, failed := p.oldest()
			select {
			case <-w.wake:
			case ack := <-ok:
				p.pop(ack, nil)
			case err := <-failed:
				p.pop(nil, err)
			case <-ctx.Done():
			}
		}
		if p.err != nil {
			w.k.dirty.Store(true)
		}
	}
	if w.err = p.wait(ctx); w.err != nil {
		w.k.dirty.Store(true)
	}
}

// due reports whether the buckets need reconciling before the next pass.
func (k *KV) due(ctx context.Context, now time.Time) (bool, string, error) {
	epoch, err := k.source.KVEpoch(ctx)
	if err != nil {
		return false, "", err
	}
	periodic := k.cfg.ReconcileInterval > 0 && now.Sub(k.lastSync) >= k.cfg.ReconcileInterval
	return k.dirty.Load() || epoch != k.epoch || periodic, epoch, nil
}

// Reconcile makes the buckets hold exactly the published state of the
// mirror: it puts every live resource whose value differs (or is missing),
// and deletes every key of a resource that is not live. The relay calls it
// between passes, when no write of its own is under way; a relay that has
// not started yet may be preceded by it, and then does not reconcile again
// at its start.
func (k *KV) Reconcile(ctx context.Context) (ReconcileStats, error) {
	now := time.Now()
	epoch, err := k.source.KVEpoch(ctx)
	if err != nil {
		return ReconcileStats{}, fmt.Errorf("reconcile KV buckets: %w", err)
	}
	losses := k.losses.Load()
	st, err := k.reconcile(ctx)
	if err != nil {
		k.dirty.Store(true)
		return st, err
	}
	// A bucket found to have lost writes while this reconciliation ran
	// (its own writes acknowledged at sequences given again) may have lost
	// them after the bucket was read: reconcile again.
	k.dirty.Store(k.losses.Load() != losses)
	k.epoch, k.lastSync = epoch, now
	return st, nil
}

func (k *KV) reconcile(ctx context.Context) (ReconcileStats, error) {
	var st ReconcileStats
	want := map[string]map[string]kvOp{"tag": {}, "repo": {}, "advisory": {}}
	err := k.source.PublishedState(ctx, func(r store.PublishedResource) error {
		op, err := putOp(r, "", "")
		if err != nil {
			return err
		}
		op.res = &r
		want[op.kind][op.key] = *op
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("reconcile KV buckets: %w", err)
	}
	// The matured digests carry the id of their event already; they are
	// put apart from the others, whose ids are looked up.
	var matured []kvOp
	if k.buckets["matured"] != nil {
		want["matured"] = map[string]kvOp{}
		err := k.source.MaturedDigests(ctx, func(d store.MaturedTag) error {
			op, err := maturedOp(d, d.EventID)
			want["matured"][op.key] = op
			return err
		})
		if err != nil {
			return st, fmt.Errorf("reconcile KV buckets: %w", err)
		}
	}
	var ops []kvOp
	for kind, kv := range k.buckets {
		have, err := bucketValues(ctx, kv)
		if err != nil {
			remade, rerr := k.remake(ctx, kind, err)
			if rerr != nil {
				return st, fmt.Errorf("reconcile KV bucket %s: %w", kv.Bucket(), rerr)
			}
			if !remade {
				return st, fmt.Errorf("reconcile KV bucket %s: %w", kv.Bucket(), err)
			}
			have = nil // a new bucket holds nothing
		}
		for key, v := range have {
			w, live := want[kind][key]
			switch {
			case !live:
				ops = append(ops, kvOp{kind: kind, key: key})
				st.Deleted++
			case sameState(kind, v, w.value):
				delete(want[kind], key)
				st.Unchanged++
			}
		}
	}
	var puts []kvOp
	var subjects []string
	for kind, byKey := range want {
		for _, op := range byKey {
			if kind == "matured" {
				matured = append(matured, op)
				continue
			}
			puts = append(puts, op)
			subjects = append(subjects, op.subject)
		}
	}
	if len(puts) > 0 {
		// The id of the event that set a state, when the mirror still has it.
		ids, err := k.source.LatestEventIDs(ctx, subjects)
		if err != nil {
			return st, fmt.Errorf("reconcile KV buckets: %w", err)
		}
		for i, op := range puts {
			if id := ids[op.subject]; id != "" {
				withID, err := putOp(*op.res, "", id)
				if err != nil {
					return st, err
				}
				puts[i].value = withID.value
			}
		}
		st.Put = len(puts)
	}
	st.Put += len(matured)
	if err := k.write(ctx, append(append(ops, puts...), matured...)); err != nil {
		return st, fmt.Errorf("reconcile KV buckets: %w", err)
	}
	return st, nil
}

// bucketValues reads every live key of kv with its value.
func bucketValues(ctx context.Context, kv jetstream.KeyValue) (map[string][]byte, error) {
	// nats.go makes the watch's consumer with a request bounded only by
	// the context, and delivers its values with no deadline at all: a
	// stream whose consumer is never made (a cluster without quorum) or
	// that stops delivering would hold the relay's pass, and every
	// publish after it, for good. Each value must come within watchStall
	// of the one before.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	limit := time.Duration(watchStall.Load())
	stalled := fmt.Errorf("%w: nothing came for %s (is JetStream without quorum?)", errWatchStalled, limit)
	stall := time.AfterFunc(limit, func() { cancel(stalled) })
	defer stall.Stop()
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		if cause := context.Cause(ctx); errors.Is(cause, errWatchStalled) {
			err = cause
		}
		return nil, err
	}
	defer w.Stop()
	out := map[string][]byte{}
	for {
		select {
		case e, ok := <-w.Updates():
			if !stall.Reset(limit) {
				<-ctx.Done() // it went off meanwhile, and cancels
				return nil, context.Cause(ctx)
			}
			if !ok {
				// The watch ended before its values were all in: its
				// subscription closed, with the context or the connection.
				// What came is not the bucket.
				if err := context.Cause(ctx); err != nil {
					return nil, err
				}
				return nil, errWatchEnded
			}
			if e == nil {
				return out, nil // the initial values are all in
			}
			if IsTermKey(e.Key()) {
				continue // a lease term's marker, no resource's state
			}
			out[e.Key()] = e.Value()
		case <-ctx.Done():
			return nil, context.Cause(ctx)
		}
	}
}

// watchStall is how long a watch of a bucket's values may wait for the
// next one (or, at its start, for its consumer) before bucketValues gives
// it up with errWatchStalled.
var watchStall atomic.Int64 // a time.Duration

func init() { watchStall.Store(int64(10 * time.Second)) }

var (
	// errWatchStalled is a watch of a bucket that stopped delivering.
	errWatchStalled = errors.New("the watch of the bucket's values stalled")
	// errWatchEnded is a watch of a bucket whose subscription closed
	// before it delivered every value.
	errWatchEnded = errors.New("the watch of the bucket's values ended before its last value")
)

// sameState reports whether two values of a bucket hold the same state,
// whichever event set it. A tag's update time is left out: a move's event
// gives the time of the history record, the mirror the listing's.
func sameState(kind string, a, b []byte) bool {
	// Most keys are unchanged at a relay's start: compare the values
	// without the fields left out as they are written (eventId last, a
	// tag's updateTime before it), which spares decoding both (15 µs a
	// key, a second at 71,000 keys); anything else goes the long way.
	if fa, ok := cutStateFields(kind, a); ok {
		if fb, ok := cutStateFields(kind, b); ok && bytes.Equal(fa, fb) {
			return true
		}
	}
	norm := func(v []byte) []byte {
		var m map[string]any
		if json.Unmarshal(v, &m) != nil {
			return v
		}
		delete(m, "eventId")
		if kind == "tag" {
			delete(m, "updateTime")
		}
		out, _ := json.Marshal(m)
		return out
	}
	return bytes.Equal(norm(a), norm(b))
}

// cutStateFields returns v without its last field when that is eventId,
// and for a tag without the updateTime then last, as json.Marshal writes
// the values (TagValue, RepoValue, AdvisoryValue end so); ok is false
// when v does not end with an eventId.
func cutStateFields(kind string, v []byte) (_ []byte, ok bool) {
	if v, ok = cutLastString(v, `,"eventId":"`); ok && kind == "tag" {
		if cut, found := cutLastString(v, `,"updateTime":"`); found {
			v = cut
		}
	}
	return v, ok
}

// cutLastString returns obj, a JSON object, without its last member when
// that is name (`,"<field>":"`) with a string value free of quotes and
// escapes. The value ends the object, so the name cannot be inside a
// string: a string's quotes are escaped there.
func cutLastString(obj []byte, name string) ([]byte, bool) {
	i := bytes.LastIndex(obj, []byte(name))
	if i < 0 || !bytes.HasSuffix(obj, []byte(`"}`)) {
		return obj, false
	}
	val := obj[i+len(name) : len(obj)-2]
	if bytes.ContainsAny(val, `"\`) {
		return obj, false
	}
	out := make([]byte, 0, i+1)
	return append(append(out, obj[:i]...), '}'), true
}

// Bucket returns the bucket of kind (tag, repo, advisory or matured; nil
// when there is none).
func (k *KV) Bucket(kind string) jetstream.KeyValue { return k.buckets[kind] }
