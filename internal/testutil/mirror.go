package testutil

import (
	"bytes"
	"database/sql"
	"fmt"
	"strings"
	"sync"
)

// MirrorState is what a follower's mirror must share with its leader's:
// every repo, tag and advisory with its state and tombstone, a line each.
func MirrorState(db *sql.DB) (string, error) {
	var b strings.Builder
	for _, q := range []string{
		`SELECT 'repo', uid, name, description, deleted_time IS NOT NULL, deletions FROM repos ORDER BY uid`,
		`SELECT 'tag', uid, digest, deprecated, deleted_time IS NOT NULL, deletions FROM tags ORDER BY uid`,
		`SELECT 'advisory', uid, advisory_id, artifact_name, deleted_time IS NOT NULL, deletions FROM advisories ORDER BY uid`,
	} {
		rows, err := db.Query(q)
		if err != nil {
			return "", err
		}
		for rows.Next() {
			var c [6]string
			if err := rows.Scan(&c[0], &c[1], &c[2], &c[3], &c[4], &c[5]); err != nil {
				rows.Close()
				return "", err
			}
			b.WriteString(strings.Join(c[:], " ") + "\n")
		}
		rows.Close()
	}
	return b.String(), nil
}

// HistoryCarried checks a follower's tag history against its leader's:
// every row the follower has (the moves the stream carried) is the
// leader's row at the same position, and it has some.
func HistoryCarried(follower, leader *sql.DB) error {
	rows, err := follower.Query(`SELECT tag_uid, seq, digest FROM tag_history ORDER BY tag_uid, seq`)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var uid, digest, want string
		var seq int
		if err := rows.Scan(&uid, &seq, &digest); err != nil {
			return err
		}
		n++
		if err := leader.QueryRow(`SELECT digest FROM tag_history WHERE tag_uid = ? AND seq = ?`, uid, seq).Scan(
			&want,
		); err != nil ||
			want != digest {
			return fmt.Errorf("tag %s history seq %d: follower %s, leader %q (%v)", uid, seq, digest, want, err)
		}
	}
	if n == 0 {
		return fmt.Errorf("the follower has no history rows: no move was carried")
	}
	return rows.Err()
}

// SameMirror is nil when the follower's mirror has the leader's state and
// history, and otherwise says where they differ.
func SameMirror(follower, leader *sql.DB) error {
	if err := SameState(follower, leader); err != nil {
		return err
	}
	return HistoryCarried(follower, leader)
}

// SameState is nil when the follower's mirror has the leader's repos, tags
// and advisories (MirrorState), and otherwise says where they differ.
func SameState(follower, leader *sql.DB) error {
	fs, ferr := MirrorState(follower)
	ls, lerr := MirrorState(leader)
	switch {
	case ferr != nil || lerr != nil:
		return fmt.Errorf("read mirrors: %v, %v", ferr, lerr)
	case fs != ls:
		return fmt.Errorf("the follower differs from the leader:\n%s", diffLines(fs, ls))
	}
	return nil
}

// diffLines lists (the first ten of) the lines only one of follower and
// leader has.
func diffLines(follower, leader string) string {
	set := func(s string) map[string]bool {
		m := map[string]bool{}
		for _, l := range strings.Split(s, "\n") {
			m[l] = true
		}
		return m
	}
	fm, lm := set(follower), set(leader)
	var out []string
	for _, l := range strings.Split(follower, "\n") {
		if !lm[l] {
			out = append(out, "only follower: "+l)
		}
	}
	for _, l := range strings.Split(leader, "\n") {
		if !fm[l] {
			out = append(out, "only leader:   "+l)
		}
	}
	return strings.Join(out[:min(len(out), 10)], "\n")
}

// Buffer is a log sink safe for concurrent use.
type Buffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *Buffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

// String is what was written.
func (b *Buffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
