package store

import (
	"bytes"
	"encoding/json"
	"math/rand/v2"
	"testing"
	"time"
)

// TestRecordedHistory_AppendJSONIsJSONMarshal: the history.recorded data
// appendJSON writes is json.Marshal's, byte for byte, and what it does not
// write the same way it leaves to json.Marshal.
func TestRecordedHistory_AppendJSONIsJSONMarshal(t *testing.T) {
	strs := []string{
		"", "latest", "acme/nginx", "sha256:" + string(bytes.Repeat([]byte("ab"), 32)),
		`quo"te`, `back\slash`, "<html>", "a&b", "tab\there", "nl\n", "ünï", "\x7f", "\u2028",
	}
	times := []time.Time{
		time.Date(2025, 1, 2, 3, 4, 5, 0, time.UTC),
		time.Date(2025, 1, 2, 3, 4, 5, 120000000, time.UTC),
		time.Date(2025, 1, 2, 3, 4, 5, 123456789, time.FixedZone("", 5*3600+1800)),
		time.Date(1, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(9999, 12, 31, 23, 59, 59, 999999999, time.UTC),
		time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC),
		time.Date(-1, 1, 1, 0, 0, 0, 0, time.UTC),
		{},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	// Mostly strings written as they are, so that both ways are taken.
	pick := func() string {
		if rng.IntN(20) == 0 {
			return strs[rng.IntN(len(strs))]
		}
		return strs[rng.IntN(4)]
	}
	plain, fallback := 0, 0
	for i := range 5000 {
		d := RecordedHistory{Tag: pick(), Path: pick(), Digest: pick()}
		if n := rng.IntN(4); n > 0 || i%7 != 0 {
			d.Records = make([]RecordedRecord, n)
			for j := range d.Records {
				at := times[rng.IntN(len(times)*3)%len(times)]
				d.Records[j] = RecordedRecord{Seq: rng.IntN(1 << 20), Time: at, Digest: pick()}
			}
		}
		want, wantErr := json.Marshal(d)
		got, ok := d.appendJSON([]byte("prefix"))
		if !ok {
			fallback++
			if string(got) != "prefix" {
				t.Fatalf("%+v: appended %q though it leaves the data to json.Marshal", d, got)
			}
			continue
		}
		plain++
		if wantErr != nil {
			t.Fatalf("%+v: appendJSON wrote %q, json.Marshal fails: %v", d, got, wantErr)
		}
		if string(got) != "prefix"+string(want) {
			t.Fatalf("%+v:\nappendJSON   %s\njson.Marshal %s", d, got[len("prefix"):], want)
		}
	}
	if plain < 100 || fallback < 100 {
		t.Fatalf("cases: %d encoded, %d left to json.Marshal; want both many", plain, fallback)
	}
}

func BenchmarkRecordedHistoryJSON(b *testing.B) {
	d := RecordedHistory{Tag: "0f3c2a1b-1111-2222-3333-444455556666/latest", Path: "acme/nginx"}
	for i := range 20 {
		d.Records = append(d.Records, RecordedRecord{
			Seq:    i,
			Time:   time.Date(2025, 1, 2, 3, 4, 5, i*1000, time.UTC),
			Digest: "sha256:" + string(bytes.Repeat([]byte("ab"), 32)),
		})
	}
	b.Run("appendJSON", func(b *testing.B) {
		for b.Loop() {
			d.appendJSON(make([]byte, 0, 64+len(d.Tag)+len(d.Path)+160*len(d.Records)))
		}
	})
	b.Run("json.Marshal", func(b *testing.B) {
		for b.Loop() {
			if _, err := json.Marshal(d); err != nil {
				b.Fatal(err)
			}
		}
	})
}
