package publish

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

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
	// Workers is how many keys are written at once; 0 means DefaultKVWorkers.
	Workers int
	Logger  *slog.Logger
}

// DefaultKVWorkers is how many keys the relay writes at once: a KV write
// waits for JetStream's acknowledgement, and one key's writes go one after
// another to keep their order, so throughput comes from many keys at once.
const DefaultKVWorkers = 64

// KVSource is what reconciling the buckets needs of the store.
type KVSource interface {
	PublishedState(ctx context.Context, fn func(store.PublishedResource) error) error
	LatestEventIDs(ctx context.Context, subjects []string) (map[string]string, error)
	KVEpoch(ctx context.Context) (string, error)
}

// KV writes the state buckets.
type KV struct {
	buckets  map[string]jetstream.KeyValue // by kind: tag, repo, advisory
	source   KVSource
	cfg      KVConfig
	log      *slog.Logger
	workers  int
	dirty    bool   // the buckets may lag the published events: reconcile
	epoch    string // the source's KVEpoch at the last reconciliation
	lastSync time.Time
	// beforeApply, when set, runs before the writes of marked events; an
	// error stops them (a test's crash point).
	beforeApply func([]store.Event) error
}

// ReconcileStats counts what a reconciliation changed.
type ReconcileStats struct {
	Put, Deleted, Unchanged int
}

// OpenKV creates or updates the buckets (binds to them when
// cfg.CheckOnly) and returns their writer, which reconciles them at its
// first use.
func OpenKV(ctx context.Context, js jetstream.JetStream, cfg KVConfig, source KVSource) (*KV, error) {
	k := &KV{buckets: map[string]jetstream.KeyValue{}, source: source, cfg: cfg, log: cfg.Logger, workers: cfg.Workers, dirty: true}
	if k.log == nil {
		k.log = slog.New(slog.DiscardHandler)
	}
	if k.workers <= 0 {
		k.workers = DefaultKVWorkers
	}
	for _, b := range []struct{ kind, name, what string }{
		{"tag", cfg.Tags, "tags: <repo path>.<tag>"},
		{"repo", cfg.Repos, "repos: <repo path>"},
		{"advisory", cfg.Advisories, "advisories: <advisory id>"},
	} {
		var kv jetstream.KeyValue
		var err error
		if cfg.CheckOnly {
			kv, err = js.KeyValue(ctx, b.name)
		} else {
			kv, err = js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
				Bucket: b.name, Description: "syncd current state of " + b.what,
				History: uint8(max(cfg.History, 1)), Replicas: max(cfg.Replicas, 1), Storage: jetstream.FileStorage,
			})
		}
		if err != nil {
			return nil, fmt.Errorf("open KV bucket %s: %w", b.name, err)
		}
		k.buckets[b.kind] = kv
	}
	return k, nil
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

func tagValue(t store.Tag, path, eventID string) TagValue {
	if path == "" {
		path = t.Path
	}
	return TagValue{Repo: path, Tag: t.Name, UID: t.UID, Digest: t.Digest, Deprecated: t.Deprecated, UpdateTime: t.UpdateTime.UTC(), EventID: eventID}
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
// of its "before" when the resource is gone or moved to another key.
func opsOf(e store.Event) ([]kvOp, error) {
	if !statefulType(e.Resource, e.Action) {
		return nil, nil
	}
	var d struct {
		Before json.RawMessage `json:"before"`
		After  json.RawMessage `json:"after"`
	}
	if err := json.Unmarshal(e.Data, &d); err != nil {
		return nil, fmt.Errorf("decode data of %s %s: %w", e.Type, e.ID, err)
	}
	var before, after *kvOp
	var err error
	if present(d.Before) {
		before, err = stateOp(e.Resource, e.Scope, d.Before, e.ID)
	}
	if err == nil && present(d.After) {
		after, err = stateOp(e.Resource, e.Scope, d.After, e.ID)
	}
	if err != nil {
		return nil, fmt.Errorf("event %s %s: %w", e.Type, e.ID, err)
	}
	var ops []kvOp
	if before != nil && (after == nil || after.key != before.key) {
		ops = append(ops, kvOp{kind: before.kind, key: before.key, subject: e.Subject})
	}
	if after != nil {
		ops = append(ops, *after)
	}
	return ops, nil
}

func present(b json.RawMessage) bool { return len(b) > 0 && string(b) != "null" }

// statefulType reports whether events of this type carry before and after
// (an advisory's lifecycle steps do not; its advisory.updated does).
func statefulType(resource, action string) bool {
	switch resource + "." + action {
	case store.AdvisoryCreated, store.AdvisoryUpdated, store.AdvisoryWithdrawn:
		return true
	}
	return resource == "repo" || resource == "tag"
}

// stateOp is the put of a resource's state as an event's data holds it.
func stateOp(resource, scope string, state json.RawMessage, eventID string) (*kvOp, error) {
	switch resource {
	case "tag":
		var t store.Tag
		if err := json.Unmarshal(state, &t); err != nil {
			return nil, err
		}
		return putOp(store.PublishedResource{Tag: &t}, scope, eventID)
	case "repo":
		var r store.Repo
		if err := json.Unmarshal(state, &r); err != nil {
			return nil, err
		}
		return putOp(store.PublishedResource{Repo: &r}, scope, eventID)
	case "advisory":
		var a store.Advisory
		if err := json.Unmarshal(state, &a); err != nil {
			return nil, err
		}
		return putOp(store.PublishedResource{Advisory: &a}, scope, eventID)
	}
	return nil, fmt.Errorf("unknown resource %q", resource)
}

// putOp is the put of r's state. A tag's path is scope when given (an
// event's scope is its repo's path).
func putOp(r store.PublishedResource, scope, eventID string) (*kvOp, error) {
	var op kvOp
	var v any
	switch {
	case r.Tag != nil:
		t := tagValue(*r.Tag, scope, eventID)
		op, v = kvOp{kind: "tag", key: TagKey(t.Repo, t.Tag), subject: t.UID}, t
	case r.Repo != nil:
		rv := RepoValue{Repo: *r.Repo, EventID: eventID}
		if rv.Path == "" {
			rv.Path = rv.Name
		}
		rv.CreateTime, rv.UpdateTime = rv.CreateTime.UTC(), rv.UpdateTime.UTC()
		op, v = kvOp{kind: "repo", key: RepoKey(rv.Path), subject: rv.UID}, rv
	case r.Advisory != nil:
		av := advisoryValue(*r.Advisory, eventID)
		op, v = kvOp{kind: "advisory", key: AdvisoryKey(av.AdvisoryID), subject: av.UID}, av
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

// Apply writes the state the events set, in their order for every key.
// The events must be published and marked so.
func (k *KV) Apply(ctx context.Context, evs []store.Event) error {
	if k.beforeApply != nil {
		if err := k.beforeApply(evs); err != nil {
			return err
		}
	}
	var ops []kvOp
	for _, e := range evs {
		o, err := opsOf(e)
		if err != nil {
			return err
		}
		ops = append(ops, o...)
	}
	return k.write(ctx, ops)
}

// write does ops, those of one key one after another in their order, and
// up to k.workers keys at once. It returns the first error.
func (k *KV) write(ctx context.Context, ops []kvOp) error {
	if len(ops) == 0 {
		return nil
	}
	type bucketKey struct{ kind, key string }
	byKey := map[bucketKey][]kvOp{}
	var order []bucketKey
	for _, o := range ops {
		bk := bucketKey{o.kind, o.key}
		if _, ok := byKey[bk]; !ok {
			order = append(order, bk)
		}
		byKey[bk] = append(byKey[bk], o)
	}
	// The first failure stops the rest: it most likely meets them all
	// (NATS unreachable), and the relay reconciles after it anyway.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan []kvOp)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var first error
	for range min(k.workers, len(order)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for seq := range work {
				for _, o := range seq {
					if err := k.do(ctx, o); err != nil {
						mu.Lock()
						if first == nil {
							first = err
							cancel()
						}
						mu.Unlock()
						break // the key's later writes must not overtake this one
					}
				}
			}
		}()
	}
	for _, bk := range order {
		if ctx.Err() != nil {
			break
		}
		work <- byKey[bk]
	}
	close(work)
	wg.Wait()
	return first
}

// do writes one op.
func (k *KV) do(ctx context.Context, o kvOp) error {
	kv := k.buckets[o.kind]
	if o.value == nil {
		if err := kv.Delete(ctx, o.key); err != nil {
			return fmt.Errorf("delete %s from KV bucket %s: %w", o.key, kv.Bucket(), err)
		}
		return nil
	}
	if _, err := kv.Put(ctx, o.key, o.value); err != nil {
		return fmt.Errorf("put %s in KV bucket %s: %w", o.key, kv.Bucket(), err)
	}
	return nil
}

// due reports whether the buckets need reconciling before the next pass.
func (k *KV) due(ctx context.Context, now time.Time) (bool, string, error) {
	epoch, err := k.source.KVEpoch(ctx)
	if err != nil {
		return false, "", err
	}
	periodic := k.cfg.ReconcileInterval > 0 && now.Sub(k.lastSync) >= k.cfg.ReconcileInterval
	return k.dirty || epoch != k.epoch || periodic, epoch, nil
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
	st, err := k.reconcile(ctx)
	if err != nil {
		k.dirty = true
		return st, err
	}
	k.dirty, k.epoch, k.lastSync = false, epoch, now
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
	var ops []kvOp
	for kind, kv := range k.buckets {
		have, err := bucketValues(ctx, kv)
		if err != nil {
			return st, fmt.Errorf("reconcile KV bucket %s: %w", kv.Bucket(), err)
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
	for _, byKey := range want {
		for _, op := range byKey {
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
	if err := k.write(ctx, append(ops, puts...)); err != nil {
		return st, fmt.Errorf("reconcile KV buckets: %w", err)
	}
	return st, nil
}

// bucketValues reads every live key of kv with its value.
func bucketValues(ctx context.Context, kv jetstream.KeyValue) (map[string][]byte, error) {
	w, err := kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, err
	}
	defer w.Stop()
	out := map[string][]byte{}
	for {
		select {
		case e := <-w.Updates():
			if e == nil {
				return out, nil // the initial values are all in
			}
			out[e.Key()] = e.Value()
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
}

// sameState reports whether two values of a bucket hold the same state,
// whichever event set it. A tag's update time is left out: a move's event
// gives the time of the history record, the mirror the listing's.
func sameState(kind string, a, b []byte) bool {
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

// Bucket returns the bucket of kind (tag, repo or advisory).
func (k *KV) Bucket(kind string) jetstream.KeyValue { return k.buckets[kind] }
