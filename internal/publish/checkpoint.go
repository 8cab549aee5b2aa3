package publish

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/store"
)

// A checkpoint is a message the leader puts on the stream, ordered with the
// events, on <subject_prefix>._checkpoint: a subject no resource's events
// use, so that a consumer of syncd.tag.> never sees one. It says that the
// replicated state after every message before it on the stream has the
// digest it carries; every follower and standby compares its own there.

// CheckpointToken is the subject token of checkpoints.
const CheckpointToken = "_checkpoint"

// CheckpointSubject is where checkpoints go.
func CheckpointSubject(prefix string) string { return prefix + "." + CheckpointToken }

// Checkpoint is a checkpoint message's body.
type Checkpoint struct {
	// Leader is the replica that wrote it; EventSeq the last seq of its
	// event log the digest covers.
	Leader   string        `json:"leader,omitempty"`
	EventSeq int64         `json:"event_seq"`
	Time     time.Time     `json:"time"`
	Digest   []DigestEntry `json:"digest"`
}

// DigestEntry is one table's part of a checkpoint's digest; the sum is
// hexadecimal, since a JSON number loses 64-bit precision in many readers.
type DigestEntry struct {
	Table string `json:"table"`
	Rows  int64  `json:"rows"`
	Sum   string `json:"sum"`
}

// maxCheckpointBytes bounds a checkpoint message a follower decodes.
const maxCheckpointBytes = 16 << 10

// NewCheckpoint returns the checkpoint of d.
func NewCheckpoint(leader string, eventSeq int64, at time.Time, d store.ReplicaDigest) Checkpoint {
	cp := Checkpoint{Leader: leader, EventSeq: eventSeq, Time: at.UTC(), Digest: make([]DigestEntry, len(d))}
	for i, t := range d {
		cp.Digest[i] = DigestEntry{Table: t.Table, Rows: t.Rows, Sum: strconv.FormatUint(t.Sum, 16)}
	}
	return cp
}

// ReplicaDigest is the checkpoint's digest as the store compares it.
func (cp Checkpoint) ReplicaDigest() (store.ReplicaDigest, error) {
	out := make(store.ReplicaDigest, len(cp.Digest))
	for i, e := range cp.Digest {
		sum, err := strconv.ParseUint(e.Sum, 16, 64)
		if err != nil {
			return nil, fmt.Errorf("checkpoint digest of %s: sum %q: %w", e.Table, e.Sum, err)
		}
		out[i] = store.TableDigest{Table: e.Table, Rows: e.Rows, Sum: sum}
	}
	return out, nil
}

// CheckpointType is a checkpoint's CloudEvents type: a consumer of
// <subject_prefix>.> that parses every message as a CloudEvent reads it,
// and ignores it as a type it does not know.
const CheckpointType = TypePrefix + "checkpoint"

// Message encodes cp as the message the relay publishes, a CloudEvent of
// source; its id, also the Nats-Msg-Id, names the event seq, the time and
// the digest: checkpoints of a quiet mirror are all alike but their time,
// and a consumer must not take them for one event delivered twice.
func (cp Checkpoint) Message(prefix, source string) (*nats.Msg, error) {
	data, err := json.Marshal(cp)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	id := "checkpoint-" + strconv.FormatInt(cp.EventSeq, 10) + "-" + strconv.FormatInt(cp.Time.UnixMilli(), 10)
	for _, e := range cp.Digest {
		id += "-" + e.Sum
	}
	ce, err := json.Marshal(CloudEvent{SpecVersion: "1.0", ID: id, Source: source, Type: CheckpointType,
		Time: cp.Time.Format(time.RFC3339Nano), DataContentType: "application/json", Data: data})
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	return &nats.Msg{
		Subject: CheckpointSubject(prefix),
		Header:  nats.Header{"Content-Type": []string{ContentType}, jetstream.MsgIDHeader: []string{id}},
		Data:    ce,
	}, nil
}

// DecodeCheckpoint reads a checkpoint message.
func DecodeCheckpoint(b []byte) (Checkpoint, error) {
	var cp Checkpoint
	if len(b) > maxCheckpointBytes {
		return cp, fmt.Errorf("checkpoint of %d bytes: more than %d", len(b), maxCheckpointBytes)
	}
	var ce CloudEvent
	if err := json.Unmarshal(b, &ce); err != nil {
		return cp, fmt.Errorf("decode checkpoint: %w", err)
	}
	if ce.Type != CheckpointType {
		return cp, fmt.Errorf("decode checkpoint: type %q, want %q", ce.Type, CheckpointType)
	}
	if err := json.Unmarshal(ce.Data, &cp); err != nil {
		return cp, fmt.Errorf("decode checkpoint: %w", err)
	}
	if len(cp.Digest) == 0 {
		return cp, errors.New("checkpoint without a digest")
	}
	if _, err := cp.ReplicaDigest(); err != nil {
		return cp, err
	}
	return cp, nil
}
