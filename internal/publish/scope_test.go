package publish_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// TestScopeToken_Capped: a scope whose escaped token exceeds
// MaxScopeToken bytes keeps a prefix of the token, cut neither inside an
// escape nor inside a UTF-8 character, and ends in "%~" and 32 hex digits
// of the SHA-256 of the whole scope: deterministic, distinct for names
// that differ only past the cut, and refused by UnescapeToken, so that a
// consumer cannot mistake it for an escaped name.
func TestScopeToken_Capped(t *testing.T) {
	long := strings.Repeat("team.a/", 1000) + "python"
	for _, tc := range []struct{ name, scope string }{
		{"Dots", long},
		{"Unicode", strings.Repeat("名前", 400)},
		{"EscapeAtTheCut", strings.Repeat("x", 164) + strings.Repeat("%", 300)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tok := publish.ScopeToken(tc.scope)
			sum := sha256.Sum256([]byte(tc.scope))
			kept, hash, ok := strings.Cut(tok, "%~")
			if !ok || hash != hex.EncodeToString(sum[:16]) {
				t.Fatalf("ScopeToken = %q, want a prefix, %%~ and the scope's hash", tok)
			}
			if len(tok) > publish.MaxScopeToken || len(tok) < publish.MaxScopeToken-3 {
				t.Errorf("len(ScopeToken) = %d, want at most %d and no more than 3 bytes under it", len(tok), publish.MaxScopeToken)
			}
			if !strings.HasPrefix(publish.EscapeToken(tc.scope), kept) {
				t.Errorf("kept %q is not a prefix of the escaped scope", kept)
			}
			if back, err := publish.UnescapeToken(kept); err != nil || !strings.HasPrefix(tc.scope, back) ||
				!utf8.ValidString(back) {
				t.Errorf("the kept prefix unescapes to %q (%v), want a whole-character prefix of the scope", back, err)
			}
			if again := publish.ScopeToken(tc.scope); again != tok {
				t.Errorf("ScopeToken is not deterministic: %q, then %q", tok, again)
			}
			if other := publish.ScopeToken(tc.scope + "2"); other == tok {
				t.Errorf("two scopes differing past the cut share the token %q", tok)
			}
			if _, err := publish.UnescapeToken(tok); err == nil || !strings.Contains(err.Error(), "capped") {
				t.Errorf("UnescapeToken(capped) = %v, want an error saying it is capped", err)
			}
			if subj := publish.Subject("syncd", "tag", "moved", tc.scope); !server.IsValidLiteralSubject(subj) ||
				!strings.HasSuffix(subj, "."+tok) {
				t.Errorf("Subject = %q, want a valid subject ending in the capped token", subj)
			}
		})
	}
	t.Run("AtTheLimit", func(t *testing.T) {
		scope := strings.Repeat("a", publish.MaxScopeToken)
		if got := publish.ScopeToken(scope); got != scope {
			t.Errorf("ScopeToken of %d bytes = %q, want it unchanged", len(scope), got)
		}
	})
}

// TestRelay_VeryLongRepoName: events of a repo whose name escapes to
// kilobytes are published on a subject with a capped scope, and the
// connection stays up: a PUB line over the server's control-line limit
// made it close the connection, and the relay sent that event first again
// after every reconnection, so nothing was published any more.
func TestRelay_VeryLongRepoName(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	cfg := srv.config(nil)
	conn := mustConnect(t, cfg)
	st := mustOpenStore(t)
	name := strings.Repeat("team.a/", 1000) + "python"
	if _, err := st.ApplyRepos(
		ctx,
		[]store.Repo{{UID: "long-uid", Name: name, Description: "long", CreateTime: baseTime, UpdateTime: baseTime}},
	); err != nil {
		t.Fatal(err)
	}
	p := newProducer(t, st)
	p.addRepos(ctx, "after", 3, 1)

	if err := publish.NewRelay(conn.JS, st, cfg).Flush(ctx); err != nil {
		t.Fatalf("Flush = %v, want every event published", err)
	}
	stored := storedEvents(t, st)
	got := consumeAll(t, conn.JS, len(stored))
	assertExactlyOnceInOrder(t, got, stored)
	if want := publish.Subject(testPrefix, "repo", "created", name); got[0].Subject != want || len(want) > 250 {
		t.Errorf(
			"the long repo's subject = %.80q… (%d bytes), want %.80q… under 250 bytes",
			got[0].Subject,
			len(got[0].Subject),
			want,
		)
	}
	if n := conn.NC.Stats().Reconnects; n != 0 {
		t.Errorf("the connection reconnected %d times, want 0", n)
	}
}
