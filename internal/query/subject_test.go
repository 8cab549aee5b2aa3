package query

import "testing"

func TestSubjectsOverlap(t *testing.T) {
	for _, c := range []struct {
		a, b string
		want bool
	}{
		{"syncd.>", "syncd-query.>", false},
		{"syncd.>", "syncd.query.>", true},
		{">", "syncd-query.>", true},
		{"*.>", "syncd-query.>", true},
		{"syncd.*", "syncd-query.>", false},
		{"syncd-query.tag.at", "syncd-query.>", true},
		{"syncd-query", "syncd-query.>", false},
		{"a.*.c", "a.b.*", true},
		{"a.b", "a.b.c", false},
	} {
		if got := SubjectsOverlap(c.a, c.b); got != c.want {
			t.Errorf("SubjectsOverlap(%q, %q) = %v, want %v", c.a, c.b, got, c.want)
		}
		if got := SubjectsOverlap(c.b, c.a); got != c.want {
			t.Errorf("SubjectsOverlap(%q, %q) = %v, want %v", c.b, c.a, got, c.want)
		}
	}
}
