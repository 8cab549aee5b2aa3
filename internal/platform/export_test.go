package platform

import (
	"net/http"
	"time"
)

// DecodeError exposes error body decoding to the fuzz target.
func DecodeError(status int, body []byte) *Error {
	return decodeError(http.MethodGet, "/fuzz", status, body)
}

// DecodeRepoPage exposes list envelope decoding to the fuzz target.
func DecodeRepoPage(body []byte) (items []Repo, next string, total int64, err error) {
	p, err := decodePage[Repo](body, "repos")
	return p.items, p.next, p.total, err
}

// RetryAfter exposes Retry-After parsing, which needs no server to test.
func RetryAfter(h http.Header, now time.Time) time.Duration { return retryAfter(h, now) }

// DecodeTagPage exposes list envelope decoding to the benchmark.
func DecodeTagPage(body []byte) (items []Tag, next string, total int64, err error) {
	p, err := decodePage[Tag](body, "tags")
	return p.items, p.next, p.total, err
}
