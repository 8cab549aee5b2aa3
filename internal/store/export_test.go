package store

import "context"

// WriterPragma reads a pragma on the writer connection, for tests that
// check the writer's settings survive a change of them.
func (s *Store) WriterPragma(ctx context.Context, name string) (string, error) {
	var v string
	err := s.w.QueryRowContext(ctx, `PRAGMA `+name).Scan(&v)
	return v, err
}

// CVSS is baseScore and rating, for tests of known vectors.
func CVSS(typ, score string) (float64, string, bool) {
	b, ok := baseScore(typ, score)
	if !ok {
		return 0, "", false
	}
	return b, rating(typ, b), true
}

// MoveCandidates is how many history positions the followers' search for
// a move's position tried so far, in this process.
func MoveCandidates() int64 { return moveCandidates.Load() }

// MaxMoveCandidates is the most positions one search tries.
const MaxMoveCandidates = maxMoveCandidates

// SetMatureChunk sets how many tags a transaction of Mature recomputes,
// until the test ends.
func SetMatureChunk(t interface{ Cleanup(func()) }, n int) {
	old := matureChunk
	matureChunk = n
	t.Cleanup(func() { matureChunk = old })
}

// SetAdoptSteps makes a restore that adopts a snapshot copy pages pages at
// a time and call after after each step, with whether it committed the
// copy, until the test ends.
func SetAdoptSteps(t interface{ Cleanup(func()) }, pages int32, after func(committed bool)) {
	oldPages, oldAfter := adoptPages, adoptStepped
	adoptPages, adoptStepped = pages, after
	t.Cleanup(func() { adoptPages, adoptStepped = oldPages, oldAfter })
}

// Adoptions is how many restores adopted a snapshot's file, in this
// process.
func Adoptions() int64 { return adoptions.Load() }

// SetAdoptDigestFault makes the digest a restore computes beside its copy
// fail with err, until the test ends.
func SetAdoptDigestFault(t interface{ Cleanup(func()) }, err error) {
	old := adoptDigestFault
	adoptDigestFault = err
	t.Cleanup(func() { adoptDigestFault = old })
}

// FileAdoptions is how many snapshots AdoptFile made mirrors, in this
// process.
func FileAdoptions() int64 { return fileAdoptions.Load() }
