package publish

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/store"
)

// BenchmarkKVWrite weighs a KV write against a plain JetStream publish, on
// the embedded server as syncd runs it: per iteration, 40,000 tag values
// (as the relay writes them) published by a plain loop (PublishMsgAsync,
// 1,024 awaiting their acknowledgement) to a stream of their own, the same
// loop to the keys of a KV bucket, and the same writes through the
// relay's KV writer (KV.write). Each reports its rate and the process's
// CPU per message:
//
//	go test -run '^$' -bench '^BenchmarkKVWrite$' -benchtime 2x ./internal/publish/
func BenchmarkKVWrite(b *testing.B) {
	ctx := context.Background()
	dir := b.TempDir()
	c, err := Connect(ctx, Config{DataDir: filepath.Join(dir, "nats"), SubjectPrefix: "syncd", Stream: "SYNCD",
		DuplicateWindow: 2 * time.Minute})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	st, err := store.Open(ctx, filepath.Join(dir, "mirror.db"), store.Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer st.Close()
	const n = 40000
	val := []byte(`{"repo":"mongodb","tag":"1.2.0-dev","uid":"org1/00c13eb4a8ee24f1/002cfa7ff2778348",` +
		`"digest":"sha256:d3340c62bc85851f18d7e422cd9e546e512b2632fe5fc43097b9ac2d3e18737c","deprecated":false,` +
		`"updateTime":"2026-11-26T07:49:42.743Z","eventId":"0191e7f6-7b1c-7c3e-9d2a-3b4c5d6e7f80"}`)
	var wall, cpu [3]time.Duration
	for i := range b.N {
		plain := fmt.Sprintf("PLAIN%d", i)
		if _, err := c.JS.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: plain,
			Subjects: []string{plain + ".>"}, Storage: jetstream.FileStorage, Duplicates: 2 * time.Minute}); err != nil {
			b.Fatal(err)
		}
		bucket := fmt.Sprintf("tags%d", i)
		k, err := OpenKV(ctx, c.JS, KVConfig{Tags: bucket, Repos: fmt.Sprintf("repos%d", i),
			Advisories: fmt.Sprintf("advisories%d", i), History: 1}, st)
		if err != nil {
			b.Fatal(err)
		}
		msgs := func(prefix string) []*nats.Msg {
			m := make([]*nats.Msg, n)
			for j := range m {
				m[j] = &nats.Msg{Subject: fmt.Sprintf("%s.repo%d.tag%d", prefix, j/50, j%50), Data: val}
			}
			return m
		}
		ops := make([]kvOp, n)
		for j := range ops {
			ops[j] = kvOp{kind: "tag", key: fmt.Sprintf("w.repo%d.tag%d", j/50, j%50), value: val}
		}
		plainMsgs, kvMsgs := msgs(plain), msgs("$KV."+bucket) // built before the timing, as ops
		runs := []func() error{
			func() error { return publishLoop(ctx, c.JS, plainMsgs) },
			func() error { return publishLoop(ctx, c.JS, kvMsgs) },
			func() error { return k.write(ctx, ops) },
		}
		for r, run := range runs {
			syscall.Sync()
			runtime.GC()
			start, used := time.Now(), CPUTime()
			if err := run(); err != nil {
				b.Fatal(err)
			}
			wall[r] += time.Since(start)
			cpu[r] += CPUTime() - used
		}
	}
	for r, name := range []string{"plain", "kv-loop", "kv-writer"} {
		msgs := float64(n * b.N)
		b.ReportMetric(msgs/wall[r].Seconds(), name+"-msgs/s")
		b.ReportMetric(float64(cpu[r].Microseconds())/msgs, name+"-cpu-us/msg")
	}
}

// publishLoop publishes msgs with up to 1,024 awaiting their
// acknowledgement, and waits for the last.
func publishLoop(ctx context.Context, js jetstream.JetStream, msgs []*nats.Msg) error {
	const window = 1024
	futs := make([]jetstream.PubAckFuture, 0, len(msgs))
	wait := func(f jetstream.PubAckFuture) error {
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return err
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for i, m := range msgs {
		if i >= window {
			if err := wait(futs[i-window]); err != nil {
				return err
			}
		}
		f, err := js.PublishMsgAsync(m)
		if err != nil {
			return err
		}
		futs = append(futs, f)
	}
	for _, f := range futs[max(0, len(futs)-window):] {
		if err := wait(f); err != nil {
			return err
		}
	}
	return nil
}

// CPUTime is the CPU time the process has used, user and system (the
// package's benchmarks, external ones included, weigh CPU with it).
func CPUTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
