package store

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
)

// Predecode decodes the data of an event of the kinds whose decoding is
// most of a follower's JSON work (a tag's state, a recorded history, an
// advisory's state), so that the caller can do it beside the writer: a
// follower does it on the goroutine that fetches the next batch while one
// is applied. ApplyStream decodes whatever is not predecoded; an event
// whose data does not decode is left as it came, and its apply fails.
func (e *StreamEvent) Predecode() {
	var err error
	switch resource, _, _ := strings.Cut(e.Type, "."); {
	case e.Type == TagMatured:
	case resource == "tag":
		e.decoded, err = unmarshalData[tagData](e.Data)
	case resource == "history":
		e.decoded, err = unmarshalData[RecordedHistory](e.Data)
	case e.Type == AdvisoryCreated || e.Type == AdvisoryUpdated || e.Type == AdvisoryWithdrawn:
		e.decoded, err = decodeAdvisoryState(e.Data)
	}
	if err != nil {
		e.decoded = nil
	}
}

// tagData is the data of a tag's event.
type tagData struct {
	Before, After *Tag
	Position      int
}

// advisoryState is the data of an advisory's created, updated or
// withdrawn event, as a follower writes it: the state, whether the event
// carried its lifecycle, and whether it withdraws it.
type advisoryState struct {
	Advisory
	complete, withdrawal bool
}

// decodedData is e's data as T: the one Predecode made, or decoded now.
func decodedData[T any](e StreamEvent) (*T, error) {
	if v, ok := e.decoded.(*T); ok {
		return v, nil
	}
	return unmarshalData[T](e.Data)
}

func unmarshalData[T any](data []byte) (*T, error) {
	v := new(T)
	if err := json.Unmarshal(data, v); err != nil {
		return nil, fmt.Errorf("decode data: %w", err)
	}
	return v, nil
}

// decodeAdvisoryState decodes an advisory's created, updated or withdrawn
// event's data.
func decodeAdvisoryState(data []byte) (*advisoryState, error) {
	var d struct{ Before, After map[string]json.RawMessage }
	if err := json.Unmarshal(data, &d); err != nil {
		return nil, fmt.Errorf("decode data: %w", err)
	}
	side, withdrawal := d.After, false
	if side == nil {
		side, withdrawal = d.Before, true
	}
	if side == nil {
		return nil, errors.New("data has neither before nor after")
	}
	// Re-encoding a map of raw members only reorders them.
	raw, _ := json.Marshal(side)
	st := &advisoryState{withdrawal: withdrawal}
	if err := json.Unmarshal(raw, &st.Advisory); err != nil {
		return nil, fmt.Errorf("decode data: %w", err)
	}
	// A leader before schema version 7 sent no lifecycle: the row is then
	// as incomplete as a migrated one.
	_, st.complete = side["events"]
	return st, nil
}
