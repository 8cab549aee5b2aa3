package query

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// Client asks the query service over NATS, as any NATS client would: a
// request to <Prefix>.<endpoint>, a JSON reply or a micro error.
type Client struct {
	NC     *nats.Conn
	Prefix string
}

// Do sends req (any JSON value; nil: {}) to endpoint and decodes the
// answer into out. A refusal is an *Error with its code; no replica
// answering is ErrNoService. ctx bounds the wait (give it a deadline).
func (c *Client) Do(ctx context.Context, endpoint string, req, out any) error {
	body := []byte("{}")
	if req != nil {
		var err error
		if body, err = json.Marshal(req); err != nil {
			return fmt.Errorf("encode %s request: %w", endpoint, err)
		}
	}
	msg, err := c.NC.RequestWithContext(ctx, c.Prefix+"."+endpoint, body)
	if errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("%w on %s.%s", ErrNoService, c.Prefix, endpoint)
	}
	if err != nil {
		return fmt.Errorf("%s: %w", endpoint, err)
	}
	if e := ReplyError(msg); e != nil {
		return e
	}
	if out == nil {
		return nil
	}
	if err := json.Unmarshal(msg.Data, out); err != nil {
		return fmt.Errorf("decode %s answer: %w", endpoint, err)
	}
	return nil
}

// ErrNoService: no replica answers on the subject (the service is off,
// or listens under another [query] prefix).
var ErrNoService = errors.New(
	"no syncd query service answers (is [query] enabled on a running syncd, with this prefix?)",
)

// ReplyError is the *Error a reply carries, nil for an answer.
func ReplyError(msg *nats.Msg) *Error {
	code := msg.Header.Get(micro.ErrorCodeHeader)
	if code == "" {
		return nil
	}
	e := &Error{}
	if json.Unmarshal(msg.Data, e) != nil || e.Code == 0 {
		n, _ := strconv.Atoi(code)
		e = &Error{Code: n, Message: msg.Header.Get(micro.ErrorHeader)}
	}
	return e
}

// SubjectsOverlap reports whether some subject matches both filters a and
// b (each may hold '*' and a final '>'): whether a stream capturing a
// would capture requests to b.
func SubjectsOverlap(a, b string) bool {
	at, bt := strings.Split(a, "."), strings.Split(b, ".")
	for i := 0; i < len(at) && i < len(bt); i++ {
		switch x, y := at[i], bt[i]; {
		case x == ">" || y == ">":
			return true
		case x != "*" && y != "*" && x != y:
			return false
		}
	}
	return len(at) == len(bt)
}
