package events

import (
	"fmt"
	"testing"
	"time"
)

// TestUsedTokens_Bounded: a token is remembered until its end and then
// dropped, so the set holds at most one token life of deliveries.
func TestUsedTokens_Bounded(t *testing.T) {
	u := newUsedTokens()
	t0 := time.Unix(1_700_000_000, 0)
	for i := range 100 {
		// One delivery a second, each token good for 11 minutes.
		now := t0.Add(time.Duration(i) * time.Second)
		if _, fresh := u.claim(fmt.Sprintf("token-%d", i), "id", now.Add(11*time.Minute), now); !fresh {
			t.Fatalf("token %d not fresh", i)
		}
	}
	if got, want := u.len(), 100; got != want {
		t.Fatalf("remembered=%d, want %d", got, want)
	}
	// Within its life a token stays taken, by the delivery it carried.
	if carried, fresh := u.claim("token-0", "other", t0.Add(time.Hour), t0.Add(10*time.Minute)); fresh || carried != "id" {
		t.Fatalf("claim within life: carried=%q fresh=%v, want id, false", carried, fresh)
	}
	// A minute after the last token ended, all are gone but the new one.
	late := t0.Add(100*time.Second + 12*time.Minute)
	if _, fresh := u.claim("new", "id", late.Add(time.Minute), late); !fresh {
		t.Fatal("new token not fresh")
	}
	if got := u.len(); got != 1 {
		t.Fatalf("remembered after expiry=%d, want 1", got)
	}
}
