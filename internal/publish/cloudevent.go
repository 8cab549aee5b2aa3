package publish

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/syncd-dev/syncd/internal/store"
)

// This file is the one owner of syncd's wire format on NATS: the subject of
// an event, its CloudEvents 1.0 envelope (structured JSON mode) with the
// type prefix, the message headers, and decoding it back into the event a
// follower applies. The relay encodes with it, and the follower (a standby
// or "syncd follow") decodes with it. The shape of data, {"before": …,
// "after": …}, is the store's: it wrote data, and it applies it.

// TypePrefix begins every CloudEvents type syncd emits: dev.syncd.tag.moved.
const TypePrefix = "dev.syncd."

// ContentType is the message content type of the CloudEvents NATS binding's
// structured mode.
const ContentType = "application/cloudevents+json"

// CloudEvent is an event in CloudEvents 1.0 structured JSON mode.
// RepairAfter is the extension attribute RepairAttribute, a stream
// sequence in decimal (a String: a CloudEvents Integer is 32 bits), set
// only on a copy the audit publishes again of a resource's own event.
type CloudEvent struct {
	SpecVersion     string          `json:"specversion"`
	ID              string          `json:"id"`
	Source          string          `json:"source"`
	Type            string          `json:"type"`
	Subject         string          `json:"subject,omitempty"`
	Time            string          `json:"time,omitempty"`
	RepairAfter     string          `json:"syncdrepairafter,omitempty"`
	DataContentType string          `json:"datacontenttype"`
	Data            json.RawMessage `json:"data"`
}

// Format is the wire format of one deployment's events: where they are
// published and what source they name.
type Format struct {
	// SubjectPrefix begins every subject: <prefix>.<resource>.<action>.<scope>.
	SubjectPrefix string
	// Source is the CloudEvents source attribute of every event.
	Source string
}

// Format is cfg's wire format.
func (cfg Config) Format() Format {
	return Format{SubjectPrefix: cfg.SubjectPrefix, Source: cfg.Source}
}

// Subject is where e is published.
func (f Format) Subject(e store.Event) string {
	return Subject(f.SubjectPrefix, e.Resource, e.Action, e.Scope)
}

// Message encodes e as its JetStream message: the CloudEvent, its content
// type, and its id as the Nats-Msg-Id that JetStream deduplicates by.
func (f Format) Message(e store.Event) *nats.Msg { return f.RepairMessage(e, 0) }

// RepairAttribute is the CloudEvents extension attribute that marks a copy
// the audit published again of a resource's own event (store.OwnResource):
// its value is the stream sequence (a decimal String) of the resource's own
// message just before it on the stream: the copy before it, or, for a
// repair's first copy, the message of the event before the first missing
// one (an original, or a copy an earlier, unfinished repair published),
// when the audit's read of the stream found it; absent otherwise. A
// replica that holds the event applies it again only when the message it
// names is the one its resource's state came from (store.ApplyStream): the
// stream's order then, and nothing an old message copied onto the stream
// later can claim.
const RepairAttribute = "syncdrepairafter"

// RepairMessage is Message with RepairAttribute set to after, when after
// is not 0.
func (f Format) RepairMessage(e store.Event, after uint64) *nats.Msg {
	// The header keys are in canonical form already, which spares
	// Header.Set's canonicalization.
	return &nats.Msg{
		Subject: f.Subject(e),
		Header:  nats.Header{"Content-Type": []string{ContentType}, jetstream.MsgIDHeader: []string{e.ID}},
		Data:    encodeEvent(f.Source, e, after),
	}
}

// encodeEvent returns what json.Marshal(CloudEvent{...}) would, faster:
// the attributes are plain ASCII in practice, which appendJSONString copies
// as they are, and data is spliced in without re-encoding, since the store
// wrote it with json.Marshal (compact and valid). Marshalling a RawMessage
// would scan and copy it again for every event, and encoding is most of the
// relay's own cost per event. FuzzEncodeEvent checks the equivalence.
func encodeEvent(source string, e store.Event, repairAfter uint64) []byte {
	data := []byte(e.Data)
	if len(data) == 0 {
		data = []byte("null")
	}
	b := make([]byte, 0, 192+len(e.ID)+len(source)+len(e.Type)+len(e.Subject)+len(data))
	b = append(b, `{"specversion":"1.0","id":`...)
	b = appendJSONString(b, e.ID)
	b = append(b, `,"source":`...)
	b = appendJSONString(b, source)
	b = append(b, `,"type":`...)
	if plainJSON(e.Type) {
		b = append(b, `"`+TypePrefix...)
		b = append(b, e.Type...)
		b = append(b, '"')
	} else {
		b = appendJSONString(b, TypePrefix+e.Type)
	}
	if e.Subject != "" {
		b = append(b, `,"subject":`...)
		b = appendJSONString(b, e.Subject)
	}
	if !e.Time.IsZero() {
		// store.FormatTime, without its string: the layout is plain ASCII.
		b = append(b, `,"time":"`...)
		b = e.Time.UTC().AppendFormat(b, store.TimeFormat)
		b = append(b, '"')
	}
	if repairAfter != 0 {
		b = append(b, `,"`+RepairAttribute+`":"`...)
		b = strconv.AppendUint(b, repairAfter, 10)
		b = append(b, '"')
	}
	b = append(b, `,"datacontenttype":"application/json","data":`...)
	b = append(b, data...)
	return append(b, '}')
}

// appendJSONString appends s as a JSON string, exactly as encoding/json
// writes it: printable ASCII other than '"', '\\', '<', '>' and '&' goes as
// it is; anything else takes the encoding/json path.
func appendJSONString(b []byte, s string) []byte {
	if !plainJSON(s) {
		q, _ := json.Marshal(s) // a string always marshals
		return append(b, q...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// plainJSON reports whether encoding/json writes s as it is between quotes.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

// Decode reads a message's data back into the event it carries, as a
// follower applies it. A message that is not a syncd event (not JSON, a
// type without TypePrefix, no id, subject or data) is an error.
func Decode(b []byte) (store.StreamEvent, error) {
	var ce CloudEvent
	if err := json.Unmarshal(b, &ce); err != nil {
		return store.StreamEvent{}, fmt.Errorf("decode CloudEvent: %w", err)
	}
	typ, ok := strings.CutPrefix(ce.Type, TypePrefix)
	if !ok || ce.ID == "" || ce.Subject == "" || len(ce.Data) == 0 {
		return store.StreamEvent{}, fmt.Errorf("CloudEvent %q of type %q is not a syncd event", ce.ID, ce.Type)
	}
	var at time.Time
	if ce.Time != "" {
		var err error
		if at, err = time.Parse(time.RFC3339Nano, ce.Time); err != nil {
			return store.StreamEvent{}, fmt.Errorf("decode CloudEvent %q: time: %w", ce.ID, err)
		}
	}
	// An attribute that is no sequence marks no copy: the event is applied
	// as any other message is, which is what a replica that does not know
	// the attribute does.
	after, _ := strconv.ParseUint(ce.RepairAfter, 10, 64)
	return store.StreamEvent{ID: ce.ID, Type: typ, Subject: ce.Subject, Time: at, Data: ce.Data,
		RepairAfter: after}, nil
}

// EscapeToken makes s usable as one token of a NATS subject, reversibly:
// '.', '*', '>', whitespace and other control bytes, and the escape
// character '%' itself become %XX (the byte in uppercase hex), as in URL
// encoding. The empty string becomes "%", which no escaped string can be.
func EscapeToken(s string) string {
	if s == "" {
		return "%"
	}
	if !strings.ContainsFunc(s, func(r rune) bool { return r < utf8.RuneSelf && escaped(byte(r)) }) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if escaped(c) {
			fmt.Fprintf(&b, "%%%02X", c)
			continue
		}
		b.WriteByte(c)
	}
	return b.String()
}

// escaped reports whether EscapeToken escapes c.
func escaped(c byte) bool {
	return c <= ' ' || c == 0x7f || c == '.' || c == '*' || c == '>' || c == '%'
}

// UnescapeToken reverses EscapeToken. A token ScopeToken capped has no
// way back: it is refused.
func UnescapeToken(tok string) (string, error) {
	if tok == "%" {
		return "", nil
	}
	if strings.Contains(tok, cappedMark) {
		return "", fmt.Errorf(
			"subject token %.40q… is capped: the scope was longer than %d bytes; read it from the event's data",
			tok,
			MaxScopeToken,
		)
	}
	var b strings.Builder
	for i := 0; i < len(tok); i++ {
		if tok[i] != '%' {
			b.WriteByte(tok[i])
			continue
		}
		if i+3 > len(tok) {
			return "", fmt.Errorf("subject token %q: truncated escape at byte %d", tok, i)
		}
		v, err := strconv.ParseUint(tok[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf("subject token %q: bad escape %q", tok, tok[i:i+3])
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// Subject is where an event is published: <prefix>.<resource>.<action>.<scope>.
func Subject(prefix, resource, action, scope string) string {
	return prefix + "." + resource + "." + action + "." + ScopeToken(scope) // one allocation
}

// MaxScopeToken is the most bytes a subject's scope token takes. A repo
// name escaped to kilobytes made a PUB line longer than the server's
// control-line limit (4 KiB by default), and the server closed the
// connection, failing every publish in flight.
const MaxScopeToken = 200

// cappedMark separates a capped token's kept prefix from its hash. It is
// no escape ('~' is not a hex digit), so no escaped scope contains it and
// UnescapeToken refuses a capped token.
const cappedMark = "%~"

// ScopeToken is the scope's token in a subject: EscapeToken(scope), or
// when that exceeds MaxScopeToken bytes, as much of it as fits before
// cappedMark and the first 32 hex digits of the SHA-256 of the whole
// scope. The prefix keeps such a subject readable and the hash keeps it
// distinct; the full scope is in the event's data (docs/events.md).
func ScopeToken(scope string) string {
	tok := EscapeToken(scope)
	if len(tok) <= MaxScopeToken {
		return tok
	}
	sum := sha256.Sum256([]byte(scope))
	tail := cappedMark + hex.EncodeToString(sum[:16])
	return tok[:cutPoint(tok, MaxScopeToken-len(tail))] + tail
}

// cutPoint is the largest n <= limit at which tok may be cut: not inside a
// UTF-8 character, nor inside a %XX escape.
func cutPoint(tok string, limit int) int {
	n := limit
	for n > 0 && !utf8.RuneStart(tok[n]) {
		n--
	}
	switch {
	case n >= 1 && tok[n-1] == '%':
		n--
	case n >= 2 && tok[n-2] == '%':
		n -= 2
	}
	return n
}
