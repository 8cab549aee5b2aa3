package publish

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestPassGate: a wait returns at once with no pass under way, when the
// pass ends, or after its longest; a pass under way holds it otherwise.
func TestPassGate(t *testing.T) {
	var g passGate
	ctx := context.Background()
	if err := g.wait(ctx, time.Hour); err != nil {
		t.Fatalf("wait with no pass under way = %v", err)
	}

	g.begin()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if err := g.wait(short, time.Hour); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait under a pass = %v, want it held until its context ended", err)
	}
	if err := g.wait(ctx, time.Millisecond); err != nil {
		t.Fatalf("wait of at most 1ms under a pass = %v, want nil once the time is up", err)
	}

	g.begin() // a second pass: the gate opens when both have ended
	done := make(chan error, 1)
	go func() { done <- g.wait(ctx, time.Hour) }()
	g.end()
	g.end()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("wait for the passes to end = %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("wait did not return after the passes ended")
	}
	if err := g.wait(ctx, time.Hour); err != nil {
		t.Fatalf("wait after the passes = %v", err)
	}
}
