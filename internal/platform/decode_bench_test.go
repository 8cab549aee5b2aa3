package platform_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/syncd-dev/syncd/internal/platform"
)

// tagPage is a full page of 200 tags as the gateway writes them.
func tagPage() []byte {
	var b strings.Builder
	b.WriteString(`{"tags":[`)
	for i := range 200 {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(
			&b,
			`{"uid":"0123456789abcdef/fedcba9876543210/%016x","name":"1.%d.%d-r%d","digest":"%s","updateTime":"2025-03-01T12:00:00.123456Z","bundles":["application","fips"],"deprecated":%t}`,
			i,
			i/10,
			i%10,
			i,
			digest(i+1),
			i%7 == 0,
		)
	}
	b.WriteString(`],"nextPageToken":"CgsxMjM0NTY3ODkwMTI","totalCount":"50000"}`)
	return []byte(b.String())
}

// BenchmarkDecodeTagPage measures the page decoder on the path that reads
// 50k tags (250 such pages).
func BenchmarkDecodeTagPage(b *testing.B) {
	body := tagPage()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		items, _, _, err := platform.DecodeTagPage(body)
		if err != nil || len(items) != 200 {
			b.Fatalf("%d items, %v", len(items), err)
		}
	}
}
