package publish_test

import (
	"bytes"
	"encoding/json"
	"strconv"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/store"
)

func TestEscapeToken(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"nginx", "nginx"},
		{"", "%"},
		{"team.a/web", "team%2Ea/web"},
		{"a*b>c", "a%2Ab%3Ec"},
		{"50%", "50%25"},
		{"%", "%25"},
		{"%25", "%2525"},
		{"white space\ttab\nnl", "white%20space%09tab%0Anl"},
		{"del\x7f", "del%7F"},
		{"ünïcode-名前", "ünïcode-名前"},
		{"a..b", "a%2E%2Eb"},
		{"$SYS", "$SYS"},
	} {
		t.Run(tc.in, func(t *testing.T) {
			got := publish.EscapeToken(tc.in)
			if got != tc.want {
				t.Fatalf("EscapeToken(%q) = %q, want %q", tc.in, got, tc.want)
			}
			back, err := publish.UnescapeToken(got)
			if err != nil {
				t.Fatalf("UnescapeToken(%q): %v", got, err)
			}
			if back != tc.in {
				t.Fatalf("UnescapeToken(%q) = %q, want %q", got, back, tc.in)
			}
			if subj := publish.Subject("syncd", "tag", "moved", tc.in); !server.IsValidLiteralSubject(subj) {
				t.Fatalf("Subject(..., %q) = %q is not a valid NATS subject", tc.in, subj)
			}
		})
	}
}

func TestUnescapeToken_Errors(t *testing.T) {
	for _, tok := range []string{"%2", "abc%", "%zz", "%%", "a%g1"} {
		if got, err := publish.UnescapeToken(tok); err == nil {
			t.Errorf("UnescapeToken(%q) = %q, want an error", tok, got)
		}
	}
}

func TestSubject(t *testing.T) {
	for _, tc := range []struct{ resource, action, scope, want string }{
		{"tag", "moved", "nginx", "syncd.tag.moved.nginx"},
		{"repo", "created", "team.a/python 3", "syncd.repo.created.team%2Ea/python%203"},
		{"advisory", "withdrawn", "openssl", "syncd.advisory.withdrawn.openssl"},
	} {
		if got := publish.Subject("syncd", tc.resource, tc.action, tc.scope); got != tc.want {
			t.Errorf("Subject(%s, %s, %q) = %q, want %q", tc.resource, tc.action, tc.scope, got, tc.want)
		}
	}
}

// FuzzEscapeToken checks, for any scope, that escaping gives one valid
// token of a literal NATS subject and that unescaping gives the scope back.
func FuzzEscapeToken(f *testing.F) {
	for _, s := range []string{"", "nginx", "a.b", "*", ">", "%", "%25", " ", "\x00", "\xff", "名前", "x.%2E*>\t"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		tok := publish.EscapeToken(s)
		if tok == "" || strings.ContainsAny(tok, ".*> \t\r\n\f\v\x00") {
			t.Fatalf("EscapeToken(%q) = %q is not a usable token", s, tok)
		}
		subj := publish.Subject("syncd", "tag", "moved", s)
		if !server.IsValidLiteralSubject(subj) {
			t.Fatalf("Subject for %q = %q is not a valid literal subject", s, subj)
		}
		if n := strings.Count(subj, "."); n != 3 {
			t.Fatalf("Subject for %q = %q has %d dots, want 3", s, subj, n)
		}
		if utf8.ValidString(s) && !utf8.ValidString(tok) {
			t.Fatalf("EscapeToken(%q) = %q broke UTF-8", s, tok)
		}
		back, err := publish.UnescapeToken(tok)
		if err != nil {
			t.Fatalf("UnescapeToken(%q): %v", tok, err)
		}
		if back != s {
			t.Fatalf("round trip of %q gave %q via %q", s, back, tok)
		}
	})
}

// TestDecode_RoundTrip: what the relay encodes, a follower decodes into the
// event the store recorded.
func TestDecode_RoundTrip(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 123e6, time.UTC)
	e := store.Event{ID: "eb2ae143", Type: "tag.moved", Resource: "tag", Action: "moved", Scope: "charts/nginx",
		Subject: "org1/r1/t1", Time: at, Data: []byte(`{"before":{"digest":"a"},"after":{"digest":"b"}}`)}
	f := publish.Format{SubjectPrefix: "syncd", Source: "https://api.example.com/org1"}
	msg := f.Message(e)
	if got, want := msg.Subject, "syncd.tag.moved.charts/nginx"; got != want {
		t.Errorf("subject=%q, want %q", got, want)
	}
	if got, want := msg.Header.Get("Nats-Msg-Id"), e.ID; got != want {
		t.Errorf("Nats-Msg-Id=%q, want %q", got, want)
	}
	got, err := publish.Decode(msg.Data)
	if err != nil {
		t.Fatal(err)
	}
	if got.ID != e.ID || got.Type != e.Type || got.Subject != e.Subject || !got.Time.Equal(at) ||
		string(got.Data) != string(e.Data) {
		t.Errorf("decoded %+v, want the event %+v", got, e)
	}
}

// TestDecode_NotASyncdEvent: a message without syncd's type prefix, id,
// subject or data, or not JSON at all, is refused rather than applied.
// TestDecode_RepairAttribute: a copy's attribute is read as the sequence
// it names; one that is no sequence (not a decimal string) marks no copy,
// and the event is applied as any other message, not set aside.
func TestDecode_RepairAttribute(t *testing.T) {
	for _, c := range []struct {
		attr string
		want uint64
	}{{`"42"`, 42}, {`"18446744073709551615"`, 1<<64 - 1}, {`"-1"`, 0}, {`"x"`, 0}, {`""`, 0}} {
		body := `{"specversion":"1.0","id":"e1","source":"s","type":"dev.syncd.repo.updated","subject":"r1",` +
			`"` + publish.RepairAttribute + `":` + c.attr + `,"datacontenttype":"application/json","data":{}}`
		e, err := publish.Decode([]byte(body))
		if err != nil || e.RepairAfter != c.want {
			t.Errorf("%s = %s: decoded %d (%v), want %d", publish.RepairAttribute, c.attr, e.RepairAfter, err, c.want)
		}
	}
}

func TestDecode_NotASyncdEvent(t *testing.T) {
	for name, data := range map[string]string{
		"NotJSON":     `{`,
		"OtherPrefix": `{"id":"1","type":"dev.other.tag.moved","subject":"s","data":{}}`,
		"NoID":        `{"type":"dev.syncd.tag.moved","subject":"s","data":{}}`,
		"NoSubject":   `{"id":"1","type":"dev.syncd.tag.moved","data":{}}`,
		"NoData":      `{"id":"1","type":"dev.syncd.tag.moved","subject":"s"}`,
		"BadTime":     `{"id":"1","type":"dev.syncd.tag.moved","subject":"s","time":"yesterday","data":{}}`,
	} {
		if _, err := publish.Decode([]byte(data)); err == nil {
			t.Errorf("%s: decoded %s without an error", name, data)
		}
	}
}

// FuzzEncodeEvent checks that the relay's hand-written encoding of an event
// is byte for byte what encoding/json makes of the CloudEvent type.
func FuzzEncodeEvent(f *testing.F) {
	f.Add(
		"eb2ae143d224be3df2a40ab22020a1f3",
		"https://console-api.example.com/g",
		"tag.moved",
		"uid/1",
		"nginx",
		int64(1772366400000),
		`{"before":null,"after":{"name":"x"}}`,
		uint64(0),
	)
	f.Add("", "", "", "", "", int64(0), "", uint64(0))
	f.Add("<id>&\"\\", "src\u2028\x00\x7f", "repo.updated", "ü\xff", "a.b", int64(-1), `"\u003c"`, uint64(1<<63))
	f.Add("id", "src", "tag.moved", "uid/1", "nginx", int64(1), `{}`, uint64(42))
	f.Fuzz(func(t *testing.T, id, source, typ, subject, scope string, ms int64, data string, after uint64) {
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
		got := relay.RepairMessage(e, after).Data
		var repairAfter string
		if after != 0 {
			repairAfter = strconv.FormatUint(after, 10)
		}
		if d, err := publish.Decode(got); err == nil && d.RepairAfter != after {
			t.Fatalf("decoded %s = %d, want %d", publish.RepairAttribute, d.RepairAfter, after)
		}
		want, err := json.Marshal(publish.CloudEvent{
			SpecVersion: "1.0", ID: id, Source: source, Type: publish.TypePrefix + typ, Subject: subject,
			Time: store.FormatTime(tm), RepairAfter: repairAfter, DataContentType: "application/json", Data: raw,
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
	data := []byte(
		`{"before":{"uid":"g1/r1/t1","name":"v1.2.3","repo":"nginx","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000001","deprecated":false,"create_time":"2026-01-01T00:00:00.000Z","update_time":"2026-01-01T00:00:00.000Z"},` +
			`"after":{"uid":"g1/r1/t1","name":"v1.2.3","repo":"nginx","digest":"sha256:0000000000000000000000000000000000000000000000000000000000000002","deprecated":false,"create_time":"2026-01-01T00:00:00.000Z","update_time":"2026-01-02T00:00:00.000Z"}}`,
	)
	e := store.Event{
		Seq:      1,
		ID:       "eb2ae143d224be3df2a40ab22020a1f3",
		Type:     "tag.moved",
		Resource: "tag",
		Action:   "moved",
		Scope:    "nginx",
		Subject:  "g1/r1/t1",
		Time:     time.Date(2026, 1, 2, 0, 0, 0, 0, time.UTC),
		Data:     data,
	}
	relay := publish.NewRelay(
		nil,
		nil,
		publish.Config{SubjectPrefix: "syncd", Source: "https://console-api.example.com/g1"},
	)
	b.ReportAllocs()
	for b.Loop() {
		relay.Message(e)
	}
}
