package query

import (
	"fmt"
	"time"
)

// The endpoints: each one's request subject below the prefix, and its
// name in "nats micro info" (names may not hold dots).
const (
	TagAt       = "tag.at"
	TagHistory  = "tag.history"
	DigestWhere = "digest.where"
	RepoTags    = "repo.tags"
	Advisories  = "advisories"
	PositionEP  = "position"
)

// Endpoints are the endpoints' subjects below the prefix, in the order
// docs/query.md lists them.
var Endpoints = []string{TagAt, TagHistory, DigestWhere, RepoTags, Advisories, PositionEP}

// Every request may carry MinSeq (min_seq): it asks for an answer read at
// this stream sequence or later. The replica waits up to [query] max_wait
// for its mirror to apply it, and answers 503 "behind" if it has not.

// Stamp is in every answer: the stream sequence the mirror had applied
// when the answer was read (every event at or below it is in the answer).
type Stamp struct {
	StreamSeq uint64 `json:"stream_seq"`
}

func (s *Stamp) stamp(seq uint64) { s.StreamSeq = seq }

// TagAtRequest asks what a tag pointed at, at an instant: Time (RFC 3339),
// or Ago (a Go duration) before now; neither: now.
type TagAtRequest struct {
	MinSeq uint64 `json:"min_seq,omitempty"`
	Repo   string `json:"repo"`
	Tag    string `json:"tag"`
	Time   string `json:"time,omitempty"`
	Ago    string `json:"ago,omitempty"`
}

// TagAtReply is the digest a tag pointed at, at Time: the history record
// in force then began at Since, and the next one at Until (nil: it is
// still in force). Deleted: the tag did not exist at Time (before its
// first record, with Until that record's time; or after its deletion,
// with Since the deletion's time). A follower that knows a tag only from
// its current state (no record of it: its history begins at the
// follower's snapshot or the stream's start) answers its digest from when
// it learnt of it on, with Since null.
type TagAtReply struct {
	Stamp
	Repo    string     `json:"repo"`
	Tag     string     `json:"tag"`
	Time    time.Time  `json:"time"`
	Digest  string     `json:"digest,omitempty"`
	Since   *time.Time `json:"since"`
	Until   *time.Time `json:"until"`
	Deleted bool       `json:"deleted"`
	// HistorySeq is the record's position in the tag's history.
	HistorySeq *int64 `json:"history_seq,omitempty"`
}

// TagHistoryRequest asks for a tag's history records whose time lies in
// [From, To) (RFC 3339; either may be left out), oldest first, Limit at a
// time (default 100, at most [query] max_limit); Cursor is the previous
// page's NextCursor.
type TagHistoryRequest struct {
	MinSeq uint64 `json:"min_seq,omitempty"`
	Repo   string `json:"repo"`
	Tag    string `json:"tag"`
	From   string `json:"from,omitempty"`
	To     string `json:"to,omitempty"`
	Limit  int    `json:"limit,omitempty"`
	Cursor string `json:"cursor,omitempty"`
}

// HistoryRecord is one record of a tag's history.
type HistoryRecord struct {
	Seq    int64     `json:"seq"`
	Time   time.Time `json:"time"`
	Digest string    `json:"digest"`
}

// TagHistoryReply is a page of records; NextCursor is set when there may
// be more.
type TagHistoryReply struct {
	Stamp
	Repo       string          `json:"repo"`
	Tag        string          `json:"tag"`
	Records    []HistoryRecord `json:"records"`
	NextCursor string          `json:"next_cursor,omitempty"`
}

// DigestWhereRequest asks where a digest has been: the whole digest
// (sha256:<hex>), or a prefix of it of at least MinDigestPrefix hex
// digits that only one digest in the mirror begins with; bare hex means
// sha256.
type DigestWhereRequest struct {
	MinSeq uint64 `json:"min_seq,omitempty"`
	Digest string `json:"digest"`
	Limit  int    `json:"limit,omitempty"`
}

// MinDigestPrefix is the shortest digest prefix digest.where accepts, in
// hex digits.
const MinDigestPrefix = 4

// Interval is a span of time in which a tag pointed at the digest: from
// From until Until (nil: it still does). From is nil when this mirror's
// history does not reach back to it (a follower that knows the tag only
// from its current state).
type Interval struct {
	Repo       string     `json:"repo"`
	Tag        string     `json:"tag"`
	From       *time.Time `json:"from"`
	Until      *time.Time `json:"until"`
	HistorySeq *int64     `json:"history_seq,omitempty"`
}

// DigestWhereReply lists the intervals, by repo, tag and time; Truncated
// when there were more than the limit.
type DigestWhereReply struct {
	Stamp
	Digest    string     `json:"digest"`
	Intervals []Interval `json:"intervals"`
	Truncated bool       `json:"truncated,omitempty"`
}

// RepoTagsRequest asks for a repo's current tags, by name, Limit at a time
// (default 100, at most max_limit) after the tag named Cursor.
type RepoTagsRequest struct {
	MinSeq uint64 `json:"min_seq,omitempty"`
	Repo   string `json:"repo"`
	Limit  int    `json:"limit,omitempty"`
	Cursor string `json:"cursor,omitempty"`
}

// Tag is a tag as repo.tags lists it.
type Tag struct {
	Tag        string     `json:"tag"`
	Digest     string     `json:"digest"`
	Deprecated bool       `json:"deprecated"`
	UpdateTime *time.Time `json:"update_time"`
}

// RepoTagsReply is a page of a repo's tags.
type RepoTagsReply struct {
	Stamp
	Repo       string `json:"repo"`
	Tags       []Tag  `json:"tags"`
	NextCursor string `json:"next_cursor,omitempty"`
}

// AdvisoriesRequest names exactly one of an artifact, an alias (a CVE or
// GHSA id) or a component; Withdrawn includes withdrawn advisories.
type AdvisoriesRequest struct {
	MinSeq    uint64 `json:"min_seq,omitempty"`
	Artifact  string `json:"artifact,omitempty"`
	Alias     string `json:"alias,omitempty"`
	Component string `json:"component,omitempty"`
	Withdrawn bool   `json:"withdrawn,omitempty"`
	Limit     int    `json:"limit,omitempty"`
}

// Advisory is an advisory with its current lifecycle state.
type Advisory struct {
	AdvisoryID   string     `json:"advisory_id"`
	UID          string     `json:"uid"`
	Artifact     string     `json:"artifact"`
	ArtifactType string     `json:"artifact_type,omitempty"`
	Architecture string     `json:"architecture,omitempty"`
	Component    string     `json:"component,omitempty"`
	Aliases      []string   `json:"aliases"`
	State        string     `json:"state,omitempty"`
	StateTime    *time.Time `json:"state_time,omitempty"`
	FixedVersion string     `json:"fixed_version,omitempty"`
	Withdrawn    *time.Time `json:"withdrawn,omitempty"`
}

// AdvisoriesReply lists the advisories found, by artifact and id.
type AdvisoriesReply struct {
	Stamp
	Advisories []Advisory `json:"advisories"`
	Truncated  bool       `json:"truncated,omitempty"`
}

// PositionRequest asks for the replica's position.
type PositionRequest struct {
	MinSeq uint64 `json:"min_seq,omitempty"`
}

func (r *TagAtRequest) minSeq() uint64       { return r.MinSeq }
func (r *TagHistoryRequest) minSeq() uint64  { return r.MinSeq }
func (r *DigestWhereRequest) minSeq() uint64 { return r.MinSeq }
func (r *RepoTagsRequest) minSeq() uint64    { return r.MinSeq }
func (r *AdvisoriesRequest) minSeq() uint64  { return r.MinSeq }
func (r *PositionRequest) minSeq() uint64    { return r.MinSeq }

// PositionReply is where the replica stands: its role, the stream sequence
// its mirror has applied (StreamSeq), how many stream messages it has yet
// to apply (Lag; a leader's mirror is ahead of the stream, 0), and whether
// its mirror has a first complete state.
type PositionReply struct {
	Stamp
	Role  string `json:"role"`
	Lag   uint64 `json:"lag"`
	Ready bool   `json:"ready"`
}

// Error codes, as HTTP's.
const (
	CodeBadRequest  = 400
	CodeNotFound    = 404
	CodeInternal    = 500
	CodeUnavailable = 503
)

// Reasons of a 503.
const (
	ReasonNotReady = "not_ready"
	ReasonBehind   = "behind"
	ReasonBusy     = "busy"
	ReasonStopping = "stopping"
	ReasonTimeout  = "timeout"
)

// Error is a refused request: a micro error (its code and description in
// the Nats-Service-Error-Code and Nats-Service-Error headers) whose body
// is this, as JSON.
type Error struct {
	Code    int    `json:"code"`
	Message string `json:"error"`
	// Reason tells the 503s apart: not_ready, behind, busy, stopping,
	// timeout.
	Reason    string `json:"reason,omitempty"`
	StreamSeq uint64 `json:"stream_seq"`
}

func (e *Error) Error() string { return fmt.Sprintf("%d: %s", e.Code, e.Message) }

func errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}
