package query_test

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/syncd-dev/syncd/internal/platformsim"
	"github.com/syncd-dev/syncd/internal/query"
	"github.com/syncd-dev/syncd/internal/store"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestService_TagAt asks for every tag at every record's instant, between
// records, before the first and now, and compares with the simulator's
// history.
func TestService_TagAt(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	w.pos.Advance(42)
	all := testutil.TagsWithHistory(w.sim.Truth())
	if len(all) < 5 {
		t.Fatalf("only %d tags with a history", len(all))
	}
	for _, tt := range all {
		h := tt.History
		for i, rec := range h {
			at := ms(rec.UpdateTime)
			// The record in force: the last one at or before at (several
			// records may share a time).
			j := i
			for j+1 < len(h) && !ms(h[j+1].UpdateTime).After(at) {
				j++
			}
			var got query.TagAtReply
			w.ask(t, query.TagAt, query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, Time: at.Format(time.RFC3339Nano)}, &got)
			wantUntil := "null"
			if j+1 < len(h) {
				wantUntil = ms(h[j+1].UpdateTime).Format(time.RFC3339Nano)
			}
			if got.Digest != h[j].Digest || got.Deleted || timeOf(got.Since) != ms(h[j].UpdateTime).Format(time.RFC3339Nano) ||
				timeOf(got.Until) != wantUntil || got.HistorySeq == nil || *got.HistorySeq != int64(j) {
				t.Fatalf("%s:%s at %s = %+v (since %s until %s), want record %d %s until %s", tt.Path, tt.Tag.Name, at,
					got, timeOf(got.Since), timeOf(got.Until), j, h[j].Digest, wantUntil)
			}
			if got.StreamSeq != 42 || got.Repo != tt.Path || got.Tag != tt.Tag.Name {
				t.Fatalf("answer %+v: want stream_seq 42, repo %s, tag %s", got, tt.Path, tt.Tag.Name)
			}
		}
		// A millisecond before the first record: the tag did not exist.
		var before query.TagAtReply
		w.ask(
			t,
			query.TagAt,
			query.TagAtRequest{
				Repo: tt.Path,
				Tag:  tt.Tag.Name,
				Time: ms(h[0].UpdateTime).Add(-time.Millisecond).Format(time.RFC3339Nano),
			},
			&before,
		)
		if !before.Deleted || before.Digest != "" || before.Since != nil ||
			timeOf(before.Until) != ms(h[0].UpdateTime).Format(time.RFC3339Nano) {
			t.Fatalf("%s:%s before its first record = %+v, want deleted until %s", tt.Path, tt.Tag.Name, before, h[0].UpdateTime)
		}
		// Now (no time): the current digest, in force until further notice.
		var now query.TagAtReply
		w.ask(t, query.TagAt, query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, Ago: "0s"}, &now)
		if now.Digest != h[len(h)-1].Digest || now.Until != nil {
			t.Fatalf("%s:%s now = %+v, want %s until null", tt.Path, tt.Tag.Name, now, h[len(h)-1].Digest)
		}
	}
}

// TestService_TagAtDeleted: after a tag's deletion it did not exist; before
// it, the last record lasts until the deletion.
func TestService_TagAtDeleted(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	tt := testutil.TagsWithHistory(w.sim.Truth())[0]
	if _, err := w.sim.Apply(platformsim.Mutation{Kind: platformsim.TagDeleted, UID: tt.Tag.UID}); err != nil {
		t.Fatal(err)
	}
	w.crawl(t)
	var deleted string
	if err := w.store.Reader().QueryRow(`SELECT deleted_time FROM tags WHERE uid = ?`, tt.Tag.UID).Scan(
		&deleted,
	); err != nil {
		t.Fatalf("the tag's deletion is not in the mirror: %v", err)
	}
	del, _ := store.ParseTime(deleted)
	var after, last query.TagAtReply
	w.ask(t, query.TagAt, query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, Time: del.Format(time.RFC3339Nano)}, &after)
	if !after.Deleted || after.Digest != "" || !after.Since.Equal(del) {
		t.Errorf("at its deletion = %+v, want deleted since %s", after, del)
	}
	lastRec := tt.History[len(tt.History)-1]
	w.ask(
		t,
		query.TagAt,
		query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, Time: del.Add(-time.Millisecond).Format(time.RFC3339Nano)},
		&last,
	)
	if last.Deleted || last.Digest != lastRec.Digest || last.Until == nil || !last.Until.Equal(del) {
		t.Errorf("just before its deletion = %+v (until %s), want %s until %s", last, timeOf(last.Until), lastRec.Digest, del)
	}
}

// TestService_TagHistory pages through every tag's history, two records at
// a time, and through a window of it.
func TestService_TagHistory(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	for _, tt := range testutil.TagsWithHistory(w.sim.Truth()) {
		var got []query.HistoryRecord
		cursor, pages := "", 0
		for {
			var page query.TagHistoryReply
			w.ask(t, query.TagHistory, query.TagHistoryRequest{Repo: tt.Path, Tag: tt.Tag.Name, Limit: 2, Cursor: cursor}, &page)
			got = append(got, page.Records...)
			pages++
			if cursor = page.NextCursor; cursor == "" {
				break
			}
			if pages > 100 {
				t.Fatal("paging does not end")
			}
		}
		if len(got) != len(tt.History) {
			t.Fatalf("%s:%s: %d records, want %d", tt.Path, tt.Tag.Name, len(got), len(tt.History))
		}
		for i, rec := range got {
			if rec.Seq != int64(i) || rec.Digest != tt.History[i].Digest || !rec.Time.Equal(ms(tt.History[i].UpdateTime)) {
				t.Fatalf("%s:%s record %d = %+v, want %+v", tt.Path, tt.Tag.Name, i, rec, tt.History[i])
			}
		}
		// [from, to): from the second record's time to the last's.
		h := tt.History
		var window query.TagHistoryReply
		w.ask(t, query.TagHistory, query.TagHistoryRequest{Repo: tt.Path, Tag: tt.Tag.Name,
			From: ms(
				h[1].UpdateTime,
			).Format(time.RFC3339Nano),
			To: ms(h[len(h)-1].UpdateTime).Format(time.RFC3339Nano)}, &window)
		for _, rec := range window.Records {
			if rec.Time.Before(ms(h[1].UpdateTime)) || !rec.Time.Before(ms(h[len(h)-1].UpdateTime)) {
				t.Fatalf("%s:%s: record %+v outside the window", tt.Path, tt.Tag.Name, rec)
			}
		}
		if len(window.Records) == 0 || window.NextCursor != "" {
			t.Fatalf("%s:%s window = %+v", tt.Path, tt.Tag.Name, window)
		}
	}
}

// TestService_DigestWhere finds every interval of a digest, by its whole
// and by a unique prefix, and refuses an ambiguous prefix.
func TestService_DigestWhere(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	all := testutil.TagsWithHistory(w.sim.Truth())
	tt := all[0]
	// Another tag comes to point at tt's first digest, and a third at a
	// digest that shares a 12-digit prefix with it.
	d := tt.History[0].Digest
	other, third := all[1], all[2]
	if err := w.sim.MoveTag(other.Tag.UID, d); err != nil {
		t.Fatal(err)
	}
	twin := d[:len("sha256:")+12] + strings.Repeat("0", 64-12)
	if twin == d {
		twin = d[:len("sha256:")+12] + strings.Repeat("1", 64-12)
	}
	if err := w.sim.MoveTag(third.Tag.UID, twin); err != nil {
		t.Fatal(err)
	}
	w.crawl(t)
	truth := w.sim.Truth()

	// The expected intervals, from the simulator's histories.
	type iv struct{ repo, tag, from, until string }
	var want []iv
	for _, x := range testutil.TagsWithHistory(truth) {
		h := x.History
		for i, rec := range h {
			if rec.Digest != d {
				continue
			}
			until := "null"
			if i+1 < len(h) {
				until = ms(h[i+1].UpdateTime).Format(time.RFC3339Nano)
			}
			want = append(want, iv{x.Path, x.Tag.Name, ms(rec.UpdateTime).Format(time.RFC3339Nano), until})
		}
	}
	if len(want) < 2 {
		t.Fatalf("want at least two intervals to find, have %v", want)
	}
	for _, asked := range []string{d, strings.TrimPrefix(d, "sha256:"), strings.ToUpper(d[:len("sha256:")+20])} {
		var got query.DigestWhereReply
		w.ask(t, query.DigestWhere, query.DigestWhereRequest{Digest: asked}, &got)
		var have []iv
		for _, x := range got.Intervals {
			have = append(have, iv{x.Repo, x.Tag, timeOf(x.From), timeOf(x.Until)})
		}
		if got.Digest != d || !slices.Equal(have, want) {
			t.Fatalf("digest.where %s = %s %+v, want %s %+v", asked, got.Digest, have, d, want)
		}
	}
	e := w.refused(t, query.DigestWhere, query.DigestWhereRequest{Digest: d[:len("sha256:")+12]}, query.CodeBadRequest, "")
	if !strings.Contains(e.Message, "ambiguous") || !strings.Contains(e.Message, twin) {
		t.Errorf("ambiguous prefix: %q, want it to name both digests", e.Message)
	}
	w.refused(
		t,
		query.DigestWhere,
		query.DigestWhereRequest{Digest: "sha256:" + strings.Repeat("e", 64)},
		query.CodeNotFound,
		"",
	)
	// Limits are capped, and say so.
	var one query.DigestWhereReply
	w.ask(t, query.DigestWhere, query.DigestWhereRequest{Digest: d, Limit: 1}, &one)
	if len(one.Intervals) != 1 || !one.Truncated {
		t.Errorf("limit 1: %+v, want one interval, truncated", one)
	}
}

// TestService_RepoTags pages through each repo's tags.
func TestService_RepoTags(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	truth := w.sim.Truth()
	for _, r := range truth.Repos {
		var repoTags []platformsim.TruthTag
		for _, tg := range truth.Tags {
			if tg.RepoUID == r.UID {
				repoTags = append(repoTags, tg)
			}
		}
		slices.SortFunc(repoTags, func(a, b platformsim.TruthTag) int { return strings.Compare(a.Name, b.Name) })
		var want []string
		for _, tg := range repoTags {
			want = append(want, tg.Name+"="+tg.Digest)
		}
		var got []string
		cursor := ""
		for {
			var page query.RepoTagsReply
			w.ask(t, query.RepoTags, query.RepoTagsRequest{Repo: r.Path, Limit: 2, Cursor: cursor}, &page)
			for _, tg := range page.Tags {
				got = append(got, tg.Tag+"="+tg.Digest)
				if tg.UpdateTime == nil {
					t.Errorf("%s:%s has no update time", r.Path, tg.Tag)
				}
			}
			if cursor = page.NextCursor; cursor == "" {
				break
			}
		}
		if !slices.Equal(got, want) {
			t.Errorf("repo.tags %s = %v, want %v", r.Path, got, want)
		}
	}
}

// TestService_Advisories looks advisories up by artifact, alias and
// component, and checks them against the advisory_states view.
func TestService_Advisories(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	truth := w.sim.Truth()
	var adv platformsim.TruthAdvisory
	for _, a := range truth.Advisories {
		if a.DeleteTime == nil && len(a.Aliases) > 0 && a.ComponentName != "" {
			adv = a
			break
		}
	}
	if adv.UID == "" {
		t.Fatal("no standing advisory with aliases and a component")
	}
	count := func(where string, arg string) int {
		var n int
		if err := w.store.Reader().QueryRow(
			`SELECT COUNT(*) FROM advisory_states WHERE deleted_time IS NULL AND `+where,
			arg,
		).Scan(
			&n,
		); err != nil {
			t.Fatal(err)
		}
		return n
	}
	for _, c := range []struct {
		req   query.AdvisoriesRequest
		where string
		arg   string
	}{
		{query.AdvisoriesRequest{Artifact: adv.ArtifactName}, "artifact_name = ?", adv.ArtifactName},
		{
			query.AdvisoriesRequest{Alias: adv.Aliases[0]},
			"uid IN (SELECT advisory_uid FROM advisory_aliases WHERE alias = ?)",
			adv.Aliases[0],
		},
		{query.AdvisoriesRequest{Component: adv.ComponentName}, "component_name = ?", adv.ComponentName},
	} {
		var got query.AdvisoriesReply
		w.ask(t, query.Advisories, c.req, &got)
		if n := count(c.where, c.arg); len(got.Advisories) != n || n == 0 {
			t.Fatalf("advisories %+v: %d, want %d", c.req, len(got.Advisories), n)
		}
		found := false
		for _, a := range got.Advisories {
			if a.UID == adv.UID {
				found = true
				if a.AdvisoryID != adv.AdvisoryID || !slices.Equal(a.Aliases, adv.Aliases) || a.Component != adv.ComponentName {
					t.Errorf("advisory %+v, want %+v", a, adv)
				}
				var state, fixed string
				w.store.Reader().
					QueryRow(`SELECT COALESCE(state, ''), COALESCE(fixed_version, '') FROM advisory_states WHERE uid = ?`, adv.UID).
					Scan(&state, &fixed)
				if a.State != state || a.FixedVersion != fixed {
					t.Errorf("advisory %s state %q fixed %q, want %q %q", adv.AdvisoryID, a.State, a.FixedVersion, state, fixed)
				}
			}
		}
		if !found {
			t.Errorf("advisories %+v does not list %s", c.req, adv.AdvisoryID)
		}
	}
	var none query.AdvisoriesReply
	w.ask(t, query.Advisories, query.AdvisoriesRequest{Alias: "CVE-1999-0000"}, &none)
	if len(none.Advisories) != 0 {
		t.Errorf("unknown alias: %+v", none)
	}
}

// TestService_Errors: every kind of refusal, each with its code.
func TestService_Errors(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{MaxLimit: 3, MaxWait: 100 * time.Millisecond})
	tt := testutil.TagsWithHistory(w.sim.Truth())[0]
	raw := func(endpoint, body string) *query.Error {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		msg, err := w.client.NC.RequestWithContext(ctx, prefix+"."+endpoint, []byte(body))
		if err != nil {
			t.Fatal(err)
		}
		if msg.Header.Get(micro.ErrorCodeHeader) == "" || msg.Header.Get(micro.ErrorHeader) == "" {
			t.Fatalf("%s %s: no micro error headers: %v %s", endpoint, body, msg.Header, msg.Data)
		}
		return query.ReplyError(msg)
	}
	for _, c := range []struct{ endpoint, body string }{
		{query.TagAt, `{"repo":`},
		{query.TagAt, `[1,2]`},
		{query.TagAt, `{"repo":"x","tag":"y","colour":"red"}`},
		{query.TagAt, `{"repo":"x","tag":"y"} {}`},
		{query.TagAt, `{"tag":"y"}`},
		{query.TagAt, `{"repo":"x","tag":"y","time":"yesterday"}`},
		{query.TagAt, `{"repo":"x","tag":"y","ago":"-1h"}`},
		{query.TagAt, `{"repo":"x","tag":"y","time":"2026-01-01T00:00:00Z","ago":"1h"}`},
		{query.TagAt, `{"repo":"x","tag":"y","min_seq":-1}`},
		{query.TagHistory, `{"repo":"x","tag":"y","limit":-1}`},
		{query.TagHistory, `{"repo":"x","tag":"y","cursor":"abc"}`},
		{query.TagHistory, `{"repo":"x","tag":"y","from":"2026-02-01","to":"2026-01-01"}`},
		{query.DigestWhere, `{}`},
		{query.DigestWhere, `{"digest":"sha256:abc"}`},
		{query.DigestWhere, `{"digest":"sha256:xyz123"}`},
		{query.DigestWhere, `{"digest":"' OR 1=1 --"}`},
		{query.Advisories, `{}`},
		{query.Advisories, `{"artifact":"a","alias":"b"}`},
		{query.RepoTags, `{"repo":"` + strings.Repeat("r", 2000) + `"}`},
	} {
		if e := raw(c.endpoint, c.body); e.Code != query.CodeBadRequest {
			t.Errorf("%s %s: %+v, want 400", c.endpoint, c.body, e)
		}
	}
	if e := raw(query.TagAt, strings.Repeat(" ", 70<<10)); e.Code != query.CodeBadRequest {
		t.Errorf("a 70 KiB request: %+v, want 400", e)
	}
	w.refused(t, query.TagAt, query.TagAtRequest{Repo: "no-such-repo", Tag: "latest"}, query.CodeNotFound, "")
	w.refused(t, query.TagAt, query.TagAtRequest{Repo: tt.Path, Tag: "no-such-tag"}, query.CodeNotFound, "")
	w.refused(t, query.TagHistory, query.TagHistoryRequest{Repo: tt.Path, Tag: "no-such-tag"}, query.CodeNotFound, "")
	w.refused(t, query.RepoTags, query.RepoTagsRequest{Repo: "no/such/repo"}, query.CodeNotFound, "")
	// A bound value, not SQL.
	w.refused(t, query.RepoTags, query.RepoTagsRequest{Repo: "x' OR '1'='1"}, query.CodeNotFound, "")
	w.refused(
		t,
		query.TagAt,
		query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, MinSeq: 10},
		query.CodeUnavailable,
		query.ReasonBehind,
	)

	// Limits are capped at max_limit (3).
	var page query.TagHistoryReply
	w.ask(t, query.TagHistory, query.TagHistoryRequest{Repo: tt.Path, Tag: tt.Tag.Name, Limit: 1 << 30}, &page)
	if len(page.Records) != 3 || page.NextCursor == "" {
		t.Errorf("limit 2^30 with max_limit 3: %d records, next %q", len(page.Records), page.NextCursor)
	}

	// A mirror without its first complete state answers 503 (position
	// answers, saying so).
	empty, err := store.Open(context.Background(), t.TempDir()+"/empty.db", store.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { empty.Close() })
	w.start(t, empty, query.Config{Prefix: "syncd-query-empty"})
	w.refused(
		t,
		query.TagAt,
		query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name},
		query.CodeUnavailable,
		query.ReasonNotReady,
	)
	var pos query.PositionReply
	w.ask(t, query.PositionEP, nil, &pos)
	if pos.Ready || pos.Role != "leader" {
		t.Errorf("position of an empty mirror: %+v", pos)
	}
}

// TestService_MinSeq: a request for a sequence the mirror has not reached
// waits for it, off the workers, and is answered once it is.
func TestService_MinSeq(t *testing.T) {
	t.Parallel()
	waiting := make(chan struct{}, 16)
	w := newWorld(t, query.Config{Concurrency: 1, MaxWait: time.Minute, RefreshEvery: time.Nanosecond,
		Refresh: func(context.Context) (uint64, error) { waiting <- struct{}{}; return 0, nil }})
	<-waiting // the service's own, at its start
	tt := testutil.TagsWithHistory(w.sim.Truth())[0]
	w.pos.Advance(5)
	type result struct {
		got query.TagAtReply
		err error
	}
	done := make(chan result, 1)
	go func() {
		var r result
		r.err = w.try(query.TagAt, query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, MinSeq: 8}, &r.got)
		done <- r
	}()
	<-waiting // it waits, and asked NATS for the position
	// Meanwhile the one worker answers others.
	var pos query.PositionReply
	w.ask(t, query.PositionEP, query.PositionRequest{}, &pos)
	if pos.StreamSeq != 5 {
		t.Errorf("position = %+v, want stream_seq 5", pos)
	}
	select {
	case r := <-done:
		t.Fatalf("answered before the mirror reached min_seq: %+v %v", r.got, r.err)
	default:
	}
	w.pos.Advance(9)
	r := <-done
	if r.err != nil || r.got.StreamSeq != 9 {
		t.Fatalf("after the mirror reached 9: %+v %v, want an answer at 9", r.got, r.err)
	}
	// Already reached: no wait.
	var now query.TagAtReply
	w.ask(t, query.TagAt, query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, MinSeq: 9}, &now)
	if now.StreamSeq != 9 {
		t.Errorf("min_seq reached: %+v", now)
	}
}

// blockedMirror holds every read until released.
type blockedMirror struct {
	query.Mirror
	release chan struct{}
	reads   atomic.Int64
}

func (m *blockedMirror) ReadMirror(ctx context.Context, fn func(*store.MirrorRead) error) error {
	m.reads.Add(1)
	select {
	case <-m.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	return m.Mirror.ReadMirror(ctx, fn)
}

// flood sends n requests at once and collects every reply within a minute:
// answers, and refusals by reason. onReply, when set, is told the counts
// after each reply.
func flood(
	t *testing.T,
	nc *nats.Conn,
	subject string,
	body []byte,
	n int,
	onReply func(answered, refused int),
) (answered int, refused map[string]int) {
	t.Helper()
	inbox := nats.NewInbox()
	replies := make(chan *nats.Msg, n)
	sub, err := nc.ChanSubscribe(inbox, replies)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	for range n {
		if err := nc.PublishRequest(subject, inbox, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	refused = map[string]int{}
	timeout := time.After(60 * time.Second)
	for range n {
		select {
		case m := <-replies:
			if e := query.ReplyError(m); e != nil {
				refused[fmt.Sprintf("%d %s", e.Code, e.Reason)]++
				if e.Code == query.CodeInternal {
					t.Logf("internal error: %s", e.Message)
				}
			} else {
				answered++
			}
			if onReply != nil {
				onReply(answered, sum(refused))
			}
		case <-timeout:
			t.Fatalf(
				"%d of %d requests left unanswered (answered %d, refused %v)",
				n-answered-sum(refused),
				n,
				answered,
				refused,
			)
		}
	}
	return answered, refused
}

func sum(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestService_Flood: requests beyond max_pending are refused at once, the
// rest answered; none is left hanging, even while reads are stuck.
func TestService_Flood(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	tt := testutil.TagsWithHistory(w.sim.Truth())[0]
	body, _ := json.Marshal(query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name})
	nc := connect(t, w.nats.URL())

	t.Run("Free", func(t *testing.T) {
		answered, refused := flood(t, nc, prefix+"."+query.TagAt, body, 3000, nil)
		if answered == 0 || answered+refused["503 busy"] != 3000 {
			t.Errorf("answered %d, refused %v; want every request answered or busy", answered, refused)
		}
		t.Logf("3000 requests at once: %d answered, %v", answered, refused)
	})
	t.Run("Stuck", func(t *testing.T) {
		m := &blockedMirror{Mirror: w.store, release: make(chan struct{})}
		w.start(t, m, query.Config{Prefix: "syncd-query-stuck", Concurrency: 2, MaxPending: 10})
		// The reads are released once the rest were refused.
		answered, refused := flood(t, nc, "syncd-query-stuck."+query.TagAt, body, 300, func(answered, refused int) {
			if answered == 0 && refused == 290 {
				close(m.release)
			}
		})
		if n := m.reads.Load(); n != 10 {
			t.Errorf("%d reads, want 10", n)
		}
		if answered != 10 || refused["503 busy"] != 290 {
			t.Errorf("answered %d, refused %v; want 10 answered, 290 busy", answered, refused)
		}
	})
}

// TestService_StopAnswersWhatIsPending: requests queued or waiting when the
// service stops are answered 503 stopping.
func TestService_StopAnswersWhatIsPending(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	tt := testutil.TagsWithHistory(w.sim.Truth())[0]
	m := &blockedMirror{Mirror: w.store, release: make(chan struct{})}
	svc := query.New(
		connect(t, w.nats.URL()),
		m,
		w.pos,
		query.Config{Prefix: "syncd-query-stop", Concurrency: 1, MaxWait: time.Minute},
	)
	if err := svc.Start(); err != nil {
		t.Fatal(err)
	}
	body, _ := json.Marshal(query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name})
	waitBody, _ := json.Marshal(query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name, MinSeq: 100})
	var wg sync.WaitGroup
	var mu sync.Mutex
	codes := map[string]int{}
	ask := func(b []byte) {
		defer wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		msg, err := w.client.NC.RequestWithContext(ctx, "syncd-query-stop."+query.TagAt, b)
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			codes[err.Error()]++
		} else if e := query.ReplyError(msg); e != nil {
			codes[fmt.Sprintf("%d %s", e.Code, e.Reason)]++
		} else {
			codes["answered"]++
		}
	}
	wg.Add(5)
	for range 4 {
		go ask(body)
	}
	go ask(waitBody)
	testutil.WaitFor(
		t,
		10*time.Second,
		"the five requests to be pending",
		func() bool { return svc.Pending() == 5 && m.reads.Load() == 1 },
	)
	svc.Stop()
	wg.Wait()
	if codes["503 stopping"] != 5 {
		t.Errorf("replies %v; want 5 stopping", codes)
	}
}

// TestService_Micro: the service is what "nats micro" expects: it answers
// PING, INFO and STATS, lists its endpoints' subjects under the prefix in
// the queue group, and counts refusals in its stats.
func TestService_Micro(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{Version: "v1.2.3"})
	w.refused(t, query.TagAt, query.TagAtRequest{Repo: "nope", Tag: "x"}, query.CodeNotFound, "")
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	subj, _ := micro.ControlSubject(micro.InfoVerb, "syncd", "")
	msg, err := w.client.NC.RequestWithContext(ctx, subj, nil)
	if err != nil {
		t.Fatal(err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatal(err)
	}
	var subjects []string
	for _, ep := range info.Endpoints {
		subjects = append(subjects, ep.Subject)
		if ep.QueueGroup != "syncd" {
			t.Errorf("endpoint %s in queue group %q, want syncd", ep.Name, ep.QueueGroup)
		}
	}
	var want []string
	for _, ep := range query.Endpoints {
		want = append(want, prefix+"."+ep)
	}
	if info.Name != "syncd" || info.Version != "1.2.3" || !slices.Equal(subjects, want) ||
		info.Metadata["prefix"] != prefix {
		t.Errorf("info = %+v, subjects %v; want syncd 1.2.3 with %v", info, subjects, want)
	}
	subj, _ = micro.ControlSubject(micro.StatsVerb, "syncd", "")
	if msg, err = w.client.NC.RequestWithContext(ctx, subj, nil); err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Endpoints []struct {
			Name        string           `json:"name"`
			NumRequests int              `json:"num_requests"`
			Data        map[string]int64 `json:"data"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatal(err)
	}
	for _, ep := range stats.Endpoints {
		if ep.Name == "tag_at" && (ep.NumRequests != 1 || ep.Data["not_found"] != 1) {
			t.Errorf("tag_at stats = %+v, want 1 request, 1 not found", ep)
		}
	}
}

// TestService_Timeout: a read that outlasts the timeout is answered 503
// timeout, and frees its worker.
func TestService_Timeout(t *testing.T) {
	t.Parallel()
	w := newWorld(t, query.Config{})
	tt := testutil.TagsWithHistory(w.sim.Truth())[0]
	m := &blockedMirror{Mirror: w.store, release: make(chan struct{})}
	w.start(t, m, query.Config{Prefix: "syncd-query-slow", Concurrency: 1, Timeout: 50 * time.Millisecond})
	for range 2 {
		w.refused(
			t,
			query.TagAt,
			query.TagAtRequest{Repo: tt.Path, Tag: tt.Tag.Name},
			query.CodeUnavailable,
			query.ReasonTimeout,
		)
	}
}
