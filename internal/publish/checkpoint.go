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

// Message encodes cp as the message the relay publishes; its Nats-Msg-Id
// names the event seq and the digest, so a checkpoint published twice is
// stored once.
func (cp Checkpoint) Message(prefix string) (*nats.Msg, error) {
	data, err := json.Marshal(cp)
	if err != nil {
		return nil, fmt.Errorf("encode checkpoint: %w", err)
	}
	id := "checkpoint-" + strconv.FormatInt(cp.EventSeq, 10)
	for _, e := range cp.Digest {
		id += "-" + e.Sum
	}
	return &nats.Msg{
		Subject: CheckpointSubject(prefix),
		Header:  nats.Header{"Content-Type": []string{"application/json"}, jetstream.MsgIDHeader: []string{id}},
		Data:    data,
	}, nil
}

// DecodeCheckpoint reads a checkpoint message's body.
func DecodeCheckpoint(b []byte) (Checkpoint, error) {
	var cp Checkpoint
	if len(b) > maxCheckpointBytes {
		return cp, fmt.Errorf("checkpoint of %d bytes: more than %d", len(b), maxCheckpointBytes)
	}
	if err := json.Unmarshal(b, &cp); err != nil {
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
