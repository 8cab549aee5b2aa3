package publish_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

// FuzzEncodeEvent checks that the relay's hand-written encoding of an event
// is byte for byte what encoding/json makes of the CloudEvent type.
func FuzzEncodeEvent(f *testing.F) {
	f.Add("eb2ae143d224be3df2a40ab22020a1f3", "https://console-api.example.com/g", "tag.moved", "uid/1", "nginx", int64(1772366400000), `{"before":null,"after":{"name":"x"}}`)
	f.Add("", "", "", "", "", int64(0), "")
	f.Add("<id>&\"\\", "src\u2028\x00\x7f", "repo.updated", "ü\xff", "a.b", int64(-1), `"\u003c"`)
	f.Fuzz(func(t *testing.T, id, source, typ, subject, scope string, ms int64, data string) {
		// The store writes data with json.Marshal, as here.
		var v any = data
		if json.Valid([]byte(data)) {
			json.Unmarshal([]byte(data), &v)
		}
		raw, err := json.Marshal(v)
		if err != nil {
			t.Fatalf("encode data: %v", err)
		}
		var tm time.Time
		if ms != 0 {
			tm = time.UnixMilli(ms % (1 << 40))
		}
		e := store.Event{ID: id, Type: typ, Subject: subject, Scope: scope, Time: tm, Data: raw}
		relay := publish.NewRelay(nil, nil, publish.Config{SubjectPrefix: "syncd", Source: source})
		got := relay.Message(e).Data
		want, err := json.Marshal(publish.CloudEvent{
			SpecVersion: "1.0", ID: id, Source: source, Type: publish.TypePrefix + typ, Subject: subject,
			Time: store.FormatTime(tm), DataContentType: "application/json", Data: raw,
		})
		if err != nil {
			t.Fatalf("reference encoding: %v", err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("encoding differs from encoding/json:\ngot  %s\nwant %s", got, want)
		}
	})
}

// BenchmarkMessage measures the relay's encoding of one tag.moved event into
// its JetStream message.
func BenchmarkMessage(b *testing.B) {
	data := []byte(`{"before":{"uid":"g1/r1/t1","name":"v1.2.3","repo":"nginx","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000001","deprecated":false,"create_time":"2026-01-01T00:00:00.000Z","update_time":"2026-01-01T00:00:00.000Z"},` +
		`"after":{"uid":"g1/r1/t1","name":"v1.2.3","repo":"nginx","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000002","deprecated":false,"create_time":"2026-01-01T00:00:00.000Z","update_time":"2026-01-02T00:00:00.000Z"}}`)
	e := store.Event{Seq: 1, ID: "eb2ae143d224be3df2a40ab22020a1f3", Type: "tag.moved", Resource: "tag", Action: "moved", Scope: "nginx",
		Subject: "g1/r1/t1", Time: time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC), Data: data}
	relay := publish.NewRelay(nil, nil, publish.Config{SubjectPrefix: "syncd", Source: "https://console-api.example.com/g1"})
	b.ReportAllocs()
	for b.Loop() {
		relay.Message(e)
	}
}
