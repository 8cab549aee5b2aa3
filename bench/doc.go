// Package bench holds syncd's benchmarks: `make bench` runs BenchmarkSyncd,
// which measures a full initial sync, idle and incremental resyncs, a
// latency-bound sync, the relay, push-to-NATS latency and peak memory
// against the in-process simulator, and prints every rate as a ratio to a
// ceiling measured in the same run (see docs/performance.md).
//
// The package has no code outside its tests; this file only documents it.
package bench
