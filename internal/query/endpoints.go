package query

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// request is a decoded, valid request.
type request interface {
	minSeq() uint64
	// read reads the answer from the mirror.
	read(ctx context.Context, s *Service, rd *store.MirrorRead) (answer, error)
}

// answer is a reply, stamped with the stream sequence it was read at.
type answer interface{ stamp(seq uint64) }

// endpoint is one endpoint: its micro name, its subject below the prefix,
// a line on its request for "nats micro info", and its decoder.
type endpoint struct {
	name, subject, doc string
	decode             func(data []byte, s *Service) (request, error)
	// anyState: it answers before the mirror is ready (position).
	anyState bool
}

var endpoints = []*endpoint{
	{
		name:    "tag_at",
		subject: TagAt,
		doc:     `{"repo","tag","time"|"ago","min_seq"}`,
		decode:  decoder(func() validated { return &TagAtRequest{} }),
	},
	{
		name:    "tag_history",
		subject: TagHistory,
		doc:     `{"repo","tag","from","to","limit","cursor","min_seq"}`,
		decode:  decoder(func() validated { return &TagHistoryRequest{} }),
	},
	{
		name:    "digest_where",
		subject: DigestWhere,
		doc:     `{"digest","limit","min_seq"}`,
		decode:  decoder(func() validated { return &DigestWhereRequest{} }),
	},
	{
		name:    "repo_tags",
		subject: RepoTags,
		doc:     `{"repo","limit","cursor","min_seq"}`,
		decode:  decoder(func() validated { return &RepoTagsRequest{} }),
	},
	{
		name:    "advisories",
		subject: Advisories,
		doc:     `{"artifact"|"alias"|"component","withdrawn","limit","min_seq"}`,
		decode:  decoder(func() validated { return &AdvisoriesRequest{} }),
	},
	{
		name:     "position",
		subject:  PositionEP,
		doc:      `{"min_seq"}`,
		decode:   decoder(func() validated { return &PositionRequest{} }),
		anyState: true,
	},
}

// validated is a request that checks itself once decoded.
type validated interface {
	request
	validate(s *Service) error
}

// decoder decodes a request made by newReq strictly (an unknown field is
// a mistake to report, not to ignore) and validates it. An empty body is {}.
func decoder(newReq func() validated) func([]byte, *Service) (request, error) {
	return func(data []byte, s *Service) (request, error) {
		req := newReq()
		if len(bytes.TrimSpace(data)) > 0 {
			dec := json.NewDecoder(bytes.NewReader(data))
			dec.DisallowUnknownFields()
			if err := dec.Decode(req); err != nil {
				return nil, errorf(CodeBadRequest, "malformed request: %v", err)
			}
			if dec.More() {
				return nil, errorf(CodeBadRequest, "malformed request: more than one JSON value")
			}
		}
		if err := req.validate(s); err != nil {
			return nil, err
		}
		return req, nil
	}
}

// Limits on what a request names.
const (
	maxName = 1024
	// defaultLimit is a page's size when the request names none.
	defaultLimit = 100
)

func checkName(field, v string) error {
	switch {
	case v == "":
		return errorf(CodeBadRequest, "%s is required", field)
	case len(v) > maxName:
		return errorf(CodeBadRequest, "%s is %d bytes long; at most %d", field, len(v), maxName)
	}
	return nil
}

// limit is the page size a request asks for, capped at MaxLimit.
func (s *Service) limit(n int) (int, error) {
	switch {
	case n < 0:
		return 0, errorf(CodeBadRequest, "limit must not be negative, got %d", n)
	case n == 0:
		return min(defaultLimit, s.cfg.MaxLimit), nil
	}
	return min(n, s.cfg.MaxLimit), nil
}

// parseTime reads an instant: RFC 3339, or a date (its midnight, UTC).
func parseTime(field, v string) (time.Time, error) {
	if t, err := time.Parse(time.RFC3339Nano, v); err == nil {
		return t.UTC(), nil
	}
	if t, err := time.Parse(time.DateOnly, v); err == nil {
		return t, nil
	}
	return time.Time{}, errorf(
		CodeBadRequest,
		"%s: not an RFC 3339 time (2026-11-20T14:00:00Z) or a date (2026-11-20): %q",
		field,
		v,
	)
}

// optTime is parseTime for an optional field; "" is the zero time.
func optTime(field, v string) (time.Time, error) {
	if v == "" {
		return time.Time{}, nil
	}
	return parseTime(field, v)
}

// findTag resolves a repo path and a tag name, or answers 404.
func findTag(ctx context.Context, rd *store.MirrorRead, repoPath, name string) (store.RepoRow, store.TagRow, error) {
	repo, err := findRepo(ctx, rd, repoPath)
	if err != nil {
		return store.RepoRow{}, store.TagRow{}, err
	}
	tag, ok, err := rd.Tag(ctx, repo.UID, name)
	if err != nil {
		return store.RepoRow{}, store.TagRow{}, err
	}
	if !ok {
		return store.RepoRow{}, store.TagRow{}, errorf(CodeNotFound, "repo %s has no tag %q in this mirror", repo.Path, name)
	}
	return repo, tag, nil
}

func findRepo(ctx context.Context, rd *store.MirrorRead, path string) (store.RepoRow, error) {
	repo, ok, err := rd.Repo(ctx, path)
	if err != nil {
		return store.RepoRow{}, err
	}
	if !ok {
		return store.RepoRow{}, errorf(
			CodeNotFound,
			"no repo %q in this mirror (name a repo by its registry path: nginx, charts/cert-manager)",
			path,
		)
	}
	return repo, nil
}

// timePtr is t, or nil for the zero time (JSON null).
func timePtr(t time.Time) *time.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}

// gone is when a tag stopped existing: its deletion, or its repo's,
// whichever came first; zero while both exist.
func gone(repo store.RepoRow, tag store.TagRow) time.Time {
	switch {
	case tag.Deleted.IsZero():
		return repo.Deleted
	case repo.Deleted.IsZero() || tag.Deleted.Before(repo.Deleted):
		return tag.Deleted
	}
	return repo.Deleted
}

// tag.at

func (r *TagAtRequest) validate(s *Service) error {
	if err := checkName("repo", r.Repo); err != nil {
		return err
	}
	if err := checkName("tag", r.Tag); err != nil {
		return err
	}
	if r.Time != "" && r.Ago != "" {
		return errorf(CodeBadRequest, "give time or ago, not both")
	}
	return nil
}

// instant is the time the request asks about.
// The mirror keeps times to the millisecond, so the instant is taken to it.
func (r *TagAtRequest) instant(now time.Time) (time.Time, error) {
	switch {
	case r.Time != "":
		t, err := parseTime("time", r.Time)
		return t.Truncate(time.Millisecond), err
	case r.Ago != "":
		d, err := time.ParseDuration(r.Ago)
		if err != nil || d < 0 {
			return time.Time{}, errorf(CodeBadRequest, "ago: not a non-negative Go duration (72h, 90m): %q", r.Ago)
		}
		now = now.Add(-d)
	}
	return now.UTC().Truncate(time.Millisecond), nil
}

func (r *TagAtRequest) read(ctx context.Context, s *Service, rd *store.MirrorRead) (answer, error) {
	at, err := r.instant(s.cfg.Now())
	if err != nil {
		return nil, err
	}
	repo, tag, err := findTag(ctx, rd, r.Repo, r.Tag)
	if err != nil {
		return nil, err
	}
	out := &TagAtReply{Repo: repo.Path, Tag: tag.Name, Time: at}
	end := gone(repo, tag)
	if !end.IsZero() && !at.Before(end) {
		out.Deleted, out.Since = true, timePtr(end)
		return out, nil
	}
	rec, ok, err := rd.RecordAt(ctx, tag.UID, at)
	if err != nil {
		return nil, err
	}
	if !ok {
		first, ok, err := rd.FirstRecord(ctx, tag.UID)
		switch {
		case err != nil:
			return nil, err
		case !ok && tag.Digest != "" && !at.Before(tag.FirstSeen):
			// A follower that knows the tag from its current state only:
			// any move since it learned of it would be a record.
			out.Digest, out.Until = tag.Digest, timePtr(end)
			return out, nil
		case !ok:
			return nil, errorf(
				CodeNotFound,
				"this mirror holds no history of %s:%s before %s, when it learnt of the tag (a follower's history begins at its snapshot or at the stream's first event)",
				repo.Path,
				tag.Name,
				tag.FirstSeen.Format(time.RFC3339Nano),
			)
		case first.Seq > 0:
			return nil, errorf(
				CodeNotFound,
				"this mirror's history of %s:%s begins at %s, after %s (a follower's history begins at its snapshot or at the stream's first event)",
				repo.Path,
				tag.Name,
				first.Time.Format(time.RFC3339Nano),
				at.Format(time.RFC3339Nano),
			)
		}
		// Before the tag's first record: it did not exist yet.
		out.Deleted, out.Until = true, timePtr(first.Time)
		return out, nil
	}
	out.Digest, out.Since, out.HistorySeq = rec.Digest, timePtr(rec.Time), &rec.Seq
	next, ok, err := rd.NextRecord(ctx, tag.UID, rec.Seq)
	if err != nil {
		return nil, err
	}
	if ok {
		out.Until = timePtr(next.Time)
	} else {
		out.Until = timePtr(end)
	}
	return out, nil
}

// tag.history

func (r *TagHistoryRequest) validate(s *Service) error {
	if err := checkName("repo", r.Repo); err != nil {
		return err
	}
	if err := checkName("tag", r.Tag); err != nil {
		return err
	}
	from, err := optTime("from", r.From)
	if err != nil {
		return err
	}
	to, err := optTime("to", r.To)
	if err != nil {
		return err
	}
	if !from.IsZero() && !to.IsZero() && !from.Before(to) {
		return errorf(CodeBadRequest, "from (%s) must be before to (%s)", r.From, r.To)
	}
	if _, err := s.limit(r.Limit); err != nil {
		return err
	}
	_, err = historyCursor(r.Cursor)
	return err
}

// historyCursor is the position after which a page of history begins.
func historyCursor(c string) (int64, error) {
	if c == "" {
		return -1, nil
	}
	n, err := strconv.ParseInt(c, 10, 64)
	if err != nil || n < 0 {
		return 0, errorf(CodeBadRequest, "cursor: not one from a previous answer's next_cursor: %q", c)
	}
	return n, nil
}

func (r *TagHistoryRequest) read(ctx context.Context, s *Service, rd *store.MirrorRead) (answer, error) {
	from, _ := optTime("from", r.From)
	to, _ := optTime("to", r.To)
	limit, _ := s.limit(r.Limit)
	after, _ := historyCursor(r.Cursor)
	repo, tag, err := findTag(ctx, rd, r.Repo, r.Tag)
	if err != nil {
		return nil, err
	}
	recs, err := rd.History(ctx, tag.UID, from, to, after, limit+1)
	if err != nil {
		return nil, err
	}
	out := &TagHistoryReply{Repo: repo.Path, Tag: tag.Name, Records: make([]HistoryRecord, 0, len(recs))}
	if len(recs) > limit {
		recs = recs[:limit]
		out.NextCursor = strconv.FormatInt(recs[limit-1].Seq, 10)
	}
	for _, rec := range recs {
		out.Records = append(out.Records, HistoryRecord{Seq: rec.Seq, Time: rec.Time, Digest: rec.Digest})
	}
	return out, nil
}

// digest.where

// digestForm is a digest or a prefix of one: an algorithm, ':', hex.
var digestForm = regexp.MustCompile(`^([a-z0-9]+):([0-9a-f]*)$`)

// normalize turns the request's digest into its canonical form: lower
// case, sha256 when no algorithm is named.
func (r *DigestWhereRequest) normalize() string {
	d := strings.ToLower(strings.TrimSpace(r.Digest))
	if !strings.Contains(d, ":") {
		d = "sha256:" + d
	}
	return d
}

func (r *DigestWhereRequest) validate(s *Service) error {
	if err := checkName("digest", r.Digest); err != nil {
		return err
	}
	m := digestForm.FindStringSubmatch(r.normalize())
	if m == nil {
		return errorf(
			CodeBadRequest,
			"digest: want sha256:<hex>, or at least %d hex digits of one: %q",
			MinDigestPrefix,
			r.Digest,
		)
	}
	if len(m[2]) < MinDigestPrefix {
		return errorf(CodeBadRequest, "digest: a prefix needs at least %d hex digits: %q", MinDigestPrefix, r.Digest)
	}
	_, err := s.limit(r.Limit)
	return err
}

func (r *DigestWhereRequest) read(ctx context.Context, s *Service, rd *store.MirrorRead) (answer, error) {
	limit, _ := s.limit(r.Limit)
	prefix := r.normalize()
	found, err := rd.DigestsWithPrefix(ctx, prefix, 2)
	if err != nil {
		return nil, err
	}
	switch {
	case len(found) == 0:
		return nil, errorf(CodeNotFound, "no tag in this mirror has pointed at a digest beginning %s", prefix)
	case len(found) > 1 && found[0] != prefix:
		return nil, errorf(
			CodeBadRequest,
			"digest prefix %s is ambiguous: %s, %s, …; give more digits",
			prefix,
			found[0],
			found[1],
		)
	}
	ivs, err := rd.DigestIntervals(ctx, found[0], limit+1)
	if err != nil {
		return nil, err
	}
	out := &DigestWhereReply{Digest: found[0], Intervals: make([]Interval, 0, len(ivs))}
	if len(ivs) > limit {
		ivs, out.Truncated = ivs[:limit], true
	}
	for _, iv := range ivs {
		v := Interval{Repo: iv.Path, Tag: iv.Tag, From: timePtr(iv.From), Until: timePtr(iv.Until)}
		if iv.Seq >= 0 {
			v.HistorySeq = &iv.Seq
		}
		out.Intervals = append(out.Intervals, v)
	}
	return out, nil
}

// repo.tags

func (r *RepoTagsRequest) validate(s *Service) error {
	if err := checkName("repo", r.Repo); err != nil {
		return err
	}
	if len(r.Cursor) > maxName {
		return errorf(CodeBadRequest, "cursor is %d bytes long; at most %d", len(r.Cursor), maxName)
	}
	_, err := s.limit(r.Limit)
	return err
}

func (r *RepoTagsRequest) read(ctx context.Context, s *Service, rd *store.MirrorRead) (answer, error) {
	limit, _ := s.limit(r.Limit)
	repo, err := findRepo(ctx, rd, r.Repo)
	if err != nil {
		return nil, err
	}
	if !repo.Deleted.IsZero() {
		return nil, errorf(CodeNotFound, "repo %s was deleted at %s", repo.Path, repo.Deleted.Format(time.RFC3339Nano))
	}
	tags, err := rd.RepoTags(ctx, repo.UID, r.Cursor, limit+1)
	if err != nil {
		return nil, err
	}
	out := &RepoTagsReply{Repo: repo.Path, Tags: make([]Tag, 0, len(tags))}
	if len(tags) > limit {
		tags = tags[:limit]
		out.NextCursor = tags[limit-1].Name
	}
	for _, t := range tags {
		out.Tags = append(
			out.Tags,
			Tag{Tag: t.Name, Digest: t.Digest, Deprecated: t.Deprecated, UpdateTime: timePtr(t.Updated)},
		)
	}
	return out, nil
}

// advisories

func (r *AdvisoriesRequest) key() (store.AdvisoryKey, string) {
	switch {
	case r.Artifact != "":
		return store.ByArtifact, r.Artifact
	case r.Alias != "":
		return store.ByAlias, r.Alias
	}
	return store.ByComponent, r.Component
}

func (r *AdvisoriesRequest) validate(s *Service) error {
	n := 0
	for _, v := range []string{r.Artifact, r.Alias, r.Component} {
		if v != "" {
			n++
		}
		if len(v) > maxName {
			return errorf(CodeBadRequest, "a name of %d bytes; at most %d", len(v), maxName)
		}
	}
	if n != 1 {
		return errorf(CodeBadRequest, "give exactly one of artifact, alias (a CVE or GHSA id) or component")
	}
	_, err := s.limit(r.Limit)
	return err
}

func (r *AdvisoriesRequest) read(ctx context.Context, s *Service, rd *store.MirrorRead) (answer, error) {
	limit, _ := s.limit(r.Limit)
	key, value := r.key()
	advs, err := rd.AdvisoriesBy(ctx, key, value, r.Withdrawn, limit+1)
	if err != nil {
		return nil, err
	}
	out := &AdvisoriesReply{Advisories: make([]Advisory, 0, len(advs))}
	if len(advs) > limit {
		advs, out.Truncated = advs[:limit], true
	}
	for _, a := range advs {
		aliases := a.Aliases
		if aliases == nil {
			aliases = []string{}
		}
		out.Advisories = append(out.Advisories, Advisory{AdvisoryID: a.AdvisoryID, UID: a.UID, Artifact: a.Artifact,
			ArtifactType: a.ArtifactType, Architecture: a.Architecture, Component: a.Component, Aliases: aliases,
			State: a.State, StateTime: timePtr(a.StateTime), FixedVersion: a.FixedVersion, Withdrawn: timePtr(a.Withdrawn)})
	}
	return out, nil
}

// position

func (r *PositionRequest) validate(*Service) error { return nil }

func (r *PositionRequest) read(ctx context.Context, s *Service, rd *store.MirrorRead) (answer, error) {
	ready := s.ready.Load()
	if !ready {
		var err error
		if ready, err = rd.Ready(ctx); err != nil {
			return nil, err
		}
	}
	return &PositionReply{Role: s.cfg.Role(), Lag: s.cfg.Lag(), Ready: ready}, nil
}
