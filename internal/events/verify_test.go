package events_test

import (
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// TestReceiver_TokenLifetime: a token is accepted only between its iat
// (give or take the clock skew) and the earlier of its exp and iat plus
// the maximum age.
func TestReceiver_TokenLifetime(t *testing.T) {
	is := newIssuer(t)
	at := func(d time.Duration) func(map[string]any) {
		return func(c map[string]any) { c["iat"] = is.now.Add(d).Unix() }
	}
	for _, tc := range []struct {
		name   string
		claims func(map[string]any)
		mod    func(*events.Config)
		status int
		reason string
	}{
		{name: "Fresh", status: 202},
		{name: "OldWithinSkew", claims: at(-10*time.Minute - 30*time.Second), status: 202},
		{
			name:   "TooOld",
			claims: func(c map[string]any) { at(-20 * time.Minute)(c); c["exp"] = is.now.Add(time.Hour).Unix() },
			status: 403,
			reason: events.ReasonTokenTooOld,
		},
		{
			name:   "TooOldForConfiguredAge",
			claims: at(-3 * time.Minute),
			mod:    func(c *events.Config) { c.MaxTokenAge = time.Minute },
			status: 403,
			reason: events.ReasonTokenTooOld,
		},
		{name: "IssuedInTheFuture", claims: at(5 * time.Minute), status: 403, reason: events.ReasonBadToken},
		{name: "FutureWithinSkew", claims: at(30 * time.Second), status: 202},
		{
			name:   "NoIssueTime",
			claims: func(c map[string]any) { delete(c, "iat") },
			status: 403,
			reason: events.ReasonBadToken,
		},
		{
			name:   "Expired",
			claims: func(c map[string]any) { at(-3 * time.Minute)(c); c["exp"] = is.now.Add(-time.Second).Unix() },
			status: 403,
			reason: events.ReasonExpiredToken,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rcv, jobs, url := is.receiver(t, tc.mod)
			runQueue(t, rcv)
			d := is.deliver(t, "id-1", pushType, "org1/r", pushBody, tc.claims)
			code, body := post(t, url, d.header, d.body)
			if code != tc.status {
				t.Fatalf("status=%d body=%s, want %d", code, body, tc.status)
			}
			if tc.reason == "" {
				if got := waitJobs(t, jobs, 1); len(got) != 1 {
					t.Fatalf("jobs=%q, want 1", got)
				}
				return
			}
			if !strings.Contains(body, tc.reason) || rcv.Stats.RejectedCount(tc.reason) != 1 {
				t.Errorf("body=%s rejected[%s]=%d, want the reason once", body, tc.reason, rcv.Stats.RejectedCount(tc.reason))
			}
			if got := jobs.list(); len(got) != 0 {
				t.Fatalf("jobs=%q, want none", got)
			}
		})
	}
}

// TestReceiver_RefusesOldTokenFromPlatform: the simulator's own token,
// still within its exp, is refused once it is older than MaxTokenAge.
func TestReceiver_RefusesOldTokenFromPlatform(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	rcv, jobs, url := f.receiver(t, func(c *events.Config) {
		c.MaxTokenAge = time.Minute
		c.Now = func() time.Time { return f.sim.Now().Add(3 * time.Minute) }
	})
	runQueue(t, rcv)
	if code, body := post(t, url, f.pushed.header, f.pushed.body); code != http.StatusForbidden ||
		!strings.Contains(body, events.ReasonTokenTooOld) {
		t.Fatalf("status=%d body=%s, want 403 %s", code, body, events.ReasonTokenTooOld)
	}
	if got := jobs.list(); len(got) != 0 {
		t.Fatalf("jobs=%q, want none", got)
	}
}

// TestReceiver_RefusesReaimedDelivery: the platform's token and body with
// other Ce-Type or Ce-Subject headers are refused and queue nothing; the
// refusals do not use up the token, so the genuine delivery still works.
func TestReceiver_RefusesReaimedDelivery(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	truth := f.sim.Truth()
	var victimRepo, victimTag string
	for _, tag := range truth.Tags {
		if tag.RepoUID != f.repoUID {
			victimRepo, victimTag = tag.RepoUID, tag.UID
			break
		}
	}
	if victimRepo == "" {
		t.Fatal("the simulator has no second repo")
	}
	reaim := func(typ, subject string) http.Header {
		h := f.pushed.header.Clone()
		h.Set("Ce-Id", "reaimed-"+typ+"-"+subject)
		if typ != "" {
			h.Set("Ce-Type", "dev.chainguard."+typ)
		}
		if subject != "" {
			h.Set("Ce-Subject", subject)
		}
		return h
	}
	rcv, jobs, url := f.receiver(t, nil)
	runQueue(t, rcv)
	for _, tc := range []struct {
		name   string
		header http.Header
		reason string
	}{
		{"OtherRepoAsSubject", reaim("", victimRepo), events.ReasonSubjectMismatch},
		{"OtherTagAsSubject", reaim("", victimTag), events.ReasonSubjectMismatch},
		{"TagCreated", reaim("api.platform.registry.tag.created.v1", victimTag), events.ReasonTypeMismatch},
		{"TagDeletedSameSubject", reaim("api.platform.registry.tag.deleted.v1", ""), events.ReasonTypeMismatch},
		{"RepoDeleted", reaim("api.platform.registry.repo.deleted.v1", victimRepo), events.ReasonTypeMismatch},
		{"RepoUpdated", reaim("api.platform.registry.repo.updated.v1", ""), events.ReasonTypeMismatch},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := post(t, url, tc.header, f.pushed.body)
			if code != http.StatusForbidden || !strings.Contains(body, tc.reason) {
				t.Fatalf("status=%d body=%s, want 403 %s", code, body, tc.reason)
			}
		})
	}
	if got, want := rcv.Stats.RejectedCount(events.ReasonSubjectMismatch)+
		rcv.Stats.RejectedCount(events.ReasonTypeMismatch), int64(6); got != want {
		t.Errorf("mismatch rejections=%d, want %d", got, want)
	}
	if code, body := post(t, url, f.pushed.header, f.pushed.body); code != http.StatusAccepted {
		t.Fatalf("genuine delivery after the re-aimed ones: status=%d body=%s, want 202", code, body)
	}
	got := waitJobs(t, jobs, 1)
	if want := "tag " + f.repoUID + " " + f.tagName; len(got) != 1 || got[0] != want {
		t.Fatalf("jobs=%q, want only [%q]", got, want)
	}
}

// TestReceiver_ResourceEventFromBody: a tag event refreshes the repo its
// signed body names; a Ce-Subject naming another is refused.
func TestReceiver_ResourceEventFromBody(t *testing.T) {
	is := newIssuer(t)
	const typ = "dev.chainguard.api.platform.registry.tag.deleted.v1"
	body := map[string]any{"uid": "org1/r/t1"}
	rcv, jobs, url := is.receiver(t, nil)
	runQueue(t, rcv)
	d := is.deliver(t, "id-1", typ, "org1/r/t1", body, nil)
	h := d.header.Clone()
	h.Set("Ce-Subject", "org1/victim/t1")
	if code, resp := post(t, url, h, d.body); code != http.StatusForbidden ||
		!strings.Contains(resp, events.ReasonSubjectMismatch) {
		t.Fatalf("other subject: status=%d body=%s, want 403 %s", code, resp, events.ReasonSubjectMismatch)
	}
	if code, resp := post(t, url, d.header, d.body); code != http.StatusAccepted {
		t.Fatalf("genuine: status=%d body=%s, want 202", code, resp)
	}
	if got := waitJobs(t, jobs, 1); len(got) != 1 || got[0] != "repo org1/r" {
		t.Fatalf("jobs=%q, want [\"repo org1/r\"]", got)
	}
}
