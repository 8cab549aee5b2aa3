package events_test

import (
	"fmt"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/events"
	"github.com/syncd-dev/syncd/internal/platformsim"
)

// replayFlood posts d n times at once, each with a fresh Ce-Id beginning
// with prefix, and counts the answers by status.
func replayFlood(t *testing.T, url string, d delivery, prefix string, n int) map[int]int {
	t.Helper()
	var mu sync.Mutex
	codes := map[int]int{}
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			h := d.header.Clone()
			h.Set("Ce-Id", fmt.Sprintf("%s-%d", prefix, i))
			code, body := post(t, url, h, d.body)
			if code == http.StatusConflict && !strings.Contains(body, events.ReasonReplayed) {
				t.Errorf("409 without the reason: %s", body)
			}
			mu.Lock()
			codes[code]++
			mu.Unlock()
		})
	}
	wg.Wait()
	return codes
}

// TestReceiver_ReplayedTokenAcceptedOnce: one captured delivery sent many
// times with fresh Ce-Ids is accepted once and does its work once, with a
// jti (the simulator's tokens) and without (keyed by digest and iat).
func TestReceiver_ReplayedTokenAcceptedOnce(t *testing.T) {
	const n = 40
	check := func(t *testing.T, rcv *events.Receiver, jobs *recordedJobs, url string, d delivery) {
		t.Helper()
		codes := replayFlood(t, url, d, "replay", n)
		if codes[http.StatusAccepted] != 1 || codes[http.StatusConflict] != n-1 {
			t.Fatalf("answers=%v, want one 202 and %d 409", codes, n-1)
		}
		if got := rcv.Stats.RejectedCount(events.ReasonReplayed); got != n-1 {
			t.Errorf("rejected[%s]=%d, want %d", events.ReasonReplayed, got, n-1)
		}
		runQueue(t, rcv)
		waitJobs(t, jobs, 1)
		// Later copies, once the job ran, are refused all the same.
		if codes := replayFlood(t, url, d, "later", 3); codes[http.StatusConflict] != 3 {
			t.Fatalf("copies after the job ran: %v, want 3 409", codes)
		}
		deadline := time.Now().Add(5 * time.Second)
		for rcv.Stats.Done.Load() < 1 && time.Now().Before(deadline) {
			time.Sleep(5 * time.Millisecond)
		}
		if got := jobs.list(); len(got) != 1 {
			t.Fatalf("jobs=%q, want exactly 1", got)
		}
	}
	t.Run("WithJTI", func(t *testing.T) {
		f := newFixture(t, platformsim.Options{})
		rcv, jobs, url := f.receiver(t, nil)
		check(t, rcv, jobs, url, f.pushed)
	})
	t.Run("WithoutJTI", func(t *testing.T) {
		is := newIssuer(t)
		rcv, jobs, url := is.receiver(t, nil)
		check(t, rcv, jobs, url, is.deliver(t, "original", pushType, "org1/r", pushBody, nil))
	})
}

// TestReceiver_RedeliveryIsNotAReplay: the same delivery again (same token,
// same Ce-Id), and the sender's retry under a new token, are acknowledged
// with 200 and no work.
func TestReceiver_RedeliveryIsNotAReplay(t *testing.T) {
	is := newIssuer(t)
	rcv, jobs, url := is.receiver(t, nil)
	d := is.deliver(t, "id-1", pushType, "org1/r", pushBody, func(c map[string]any) { c["jti"] = "token-1" })
	retry := is.deliver(t, "id-1", pushType, "org1/r", pushBody, func(c map[string]any) { c["jti"] = "token-2" })
	for i, want := range []int{202, 200, 200, 200} {
		dd := d
		if i == 3 {
			dd = retry
		}
		if code, body := post(t, url, dd.header, dd.body); code != want {
			t.Fatalf("delivery %d: status=%d body=%s, want %d", i, code, body, want)
		}
	}
	runQueue(t, rcv)
	if got := waitJobs(t, jobs, 1); len(got) != 1 {
		t.Fatalf("jobs=%q, want 1", got)
	}
	if got := rcv.Stats.Duplicate.Load(); got != 3 {
		t.Fatalf("duplicates=%d, want 3", got)
	}
}

// TestReceiver_ReplayAfterRestart: tokens are kept with the delivery ids,
// so a receiver started later (sharing the store) still refuses a replay.
func TestReceiver_ReplayAfterRestart(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	store := &memDeliveries{}
	cfg := events.Config{Issuer: f.simURL, Groups: []string{"org1"}, TypePrefix: "dev.chainguard.", Now: f.sim.Now}
	_, _, url := serveReceiver(t, cfg, store)
	if code, body := post(t, url, f.pushed.header, f.pushed.body); code != http.StatusAccepted {
		t.Fatalf("first: status=%d body=%s", code, body)
	}
	rcv, jobs, url := serveReceiver(t, cfg, store)
	runQueue(t, rcv)
	if codes := replayFlood(t, url, f.pushed, "replay", 5); codes[http.StatusConflict] != 5 {
		t.Fatalf("replays after restart: %v, want 5 409", codes)
	}
	if code, _ := post(t, url, f.pushed.header, f.pushed.body); code != http.StatusOK {
		t.Fatalf("redelivery after restart: status=%d, want 200", code)
	}
	if codes := replayFlood(t, url, f.pushed, "later", 5); codes[http.StatusConflict] != 5 {
		t.Fatalf("replays after the redelivery: %v, want 5 409", codes)
	}
	if got := jobs.list(); len(got) != 0 {
		t.Fatalf("jobs=%q, want none", got)
	}
}

// TestReceiver_CoalescesRefreshesOfOneTag: distinct genuine deliveries for
// one tag, while its refresh waits, are all accepted and add no work; once
// the refresh has started, the next one queues another.
func TestReceiver_CoalescesRefreshesOfOneTag(t *testing.T) {
	f := newFixture(t, platformsim.Options{})
	tag := f.sim.Truth().Tags[0]
	pushes := []delivery{f.pushed}
	for range 4 {
		pushes = append(pushes, f.push(t, tag))
	}
	rcv, jobs, url := f.receiver(t, nil)
	for i, d := range pushes {
		if code, body := post(t, url, d.header, d.body); code != http.StatusAccepted {
			t.Fatalf("push %d: status=%d body=%s, want 202", i, code, body)
		}
	}
	if got, want := rcv.Stats.Accepted.Load(), int64(5); got != want {
		t.Errorf("accepted=%d, want %d", got, want)
	}
	if got, want := rcv.Stats.Coalesced.Load(), int64(4); got != want {
		t.Errorf("coalesced=%d, want %d", got, want)
	}
	runQueue(t, rcv)
	want := "tag " + f.repoUID + " " + f.tagName
	if got := waitJobs(t, jobs, 1); len(got) != 1 || got[0] != want {
		t.Fatalf("jobs=%q, want [%q]", got, want)
	}
	deadline := time.Now().Add(5 * time.Second)
	for rcv.Stats.Done.Load() < 1 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	if got := jobs.list(); len(got) != 1 {
		t.Fatalf("jobs=%q, want still 1", got)
	}
	later := f.push(t, tag)
	if code, body := post(t, url, later.header, later.body); code != http.StatusAccepted {
		t.Fatalf("later push: status=%d body=%s, want 202", code, body)
	}
	if got := waitJobs(t, jobs, 2); len(got) != 2 {
		t.Fatalf("jobs=%q, want a second refresh", got)
	}
}
