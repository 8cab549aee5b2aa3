package publish

import (
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/store"
)

// TestSameState: values of one state compare equal whichever event set
// them (and a tag's whatever its update time), by the quick comparison
// and the decoding one alike; any other difference counts.
func TestSameState(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	tag := func(digest string, at time.Time, id string) []byte {
		op, err := putOp(
			store.PublishedResource{Tag: &store.Tag{Name: "v1", Path: "org/app", UID: "u/1", Digest: digest, UpdateTime: at}},
			"",
			id,
		)
		if err != nil {
			t.Fatal(err)
		}
		return op.value
	}
	repo := func(desc string, at time.Time, id string) []byte {
		op, err := putOp(
			store.PublishedResource{Repo: &store.Repo{Name: "app", UID: "u", Description: desc, UpdateTime: at}},
			"",
			id,
		)
		if err != nil {
			t.Fatal(err)
		}
		return op.value
	}
	for _, c := range []struct {
		name, kind string
		a, b       []byte
		want       bool
	}{
		{"tag, other event and time", "tag", tag("sha256:1", at, "e1"), tag("sha256:1", at.Add(time.Hour), ""), true},
		{"tag without a time", "tag", tag("sha256:1", time.Time{}, "e1"), tag("sha256:1", at, "e2"), true},
		{"tag moved", "tag", tag("sha256:1", at, "e1"), tag("sha256:2", at, "e1"), false},
		{"repo, other event", "repo", repo("d", at, "e1"), repo("d", at, ""), true},
		{"repo updated", "repo", repo("d", at, "e1"), repo("d", at.Add(time.Hour), "e1"), false},
		{"an id with an escape", "tag", tag("sha256:1", at, `e"1`), tag("sha256:1", at, ""), true},
	} {
		if got := sameState(c.kind, c.a, c.b); got != c.want {
			t.Errorf("%s: sameState = %v, want %v\n%s\n%s", c.name, got, c.want, c.a, c.b)
		}
	}
}
