package platform_test

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// fakeSTS is a security token service on loopback: it checks each exchange
// the way the vendor's gateway reads it and answers with answer's result.
type fakeSTS struct {
	t   *testing.T
	srv *httptest.Server

	mu        sync.Mutex
	exchanges int      // requests that reached the exchange
	externals []string // the external token of each exchange
	// answer decides the response to the n-th exchange (1-based).
	answer func(n int, w http.ResponseWriter)
}

func newFakeSTS(t *testing.T, answer func(n int, w http.ResponseWriter)) *fakeSTS {
	f := &fakeSTS{t: t, answer: answer}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeSTS) serve(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || r.URL.Path != "/sts/exchange" {
		http.Error(w, `{"code":5,"message":"no such method"}`, http.StatusNotFound)
		return
	}
	if ct := r.Header.Get("Content-Type"); ct != "application/x-www-form-urlencoded" {
		f.t.Errorf("exchange sent as %q, want a form", ct)
	}
	if err := r.ParseForm(); err != nil {
		f.t.Errorf("parse form: %v", err)
	}
	if got := r.PostForm["aud"]; len(got) != 1 || got[0] != "https://api.test" {
		f.t.Errorf("aud = %q, want [https://api.test]", got)
	}
	if got := r.PostForm.Get("identity"); got != "org1/ident7" {
		f.t.Errorf("identity = %q", got)
	}
	ext, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		f.t.Errorf("no bearer external token")
	}
	f.mu.Lock()
	f.exchanges++
	n := f.exchanges
	f.externals = append(f.externals, ext)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/json")
	f.answer(n, w)
}

func (f *fakeSTS) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.exchanges
}

// tokenAnswer answers with token "exchanged-<n>", expiring at expiry (none
// when zero), in the gateway's JSON.
func tokenAnswer(w http.ResponseWriter, n int, expiry string) {
	exp := ""
	if expiry != "" {
		exp = fmt.Sprintf(`,"expiry":%q`, expiry)
	}
	fmt.Fprintf(w, `{"token":"exchanged-%d","refreshToken":"refresh-%d"%s,"unknownField":{"x":1}}`, n, n, exp)
}

// externalFile writes the external token to a file in dir, as a projected
// service-account token is, and returns a FileToken reading it.
func externalFile(t *testing.T, tok string) (*platform.FileToken, func(string)) {
	path := filepath.Join(t.TempDir(), "token")
	write := func(tok string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(tok), 0o600); err != nil {
			t.Fatal(err)
		}
		// Keep the size and mtime: a rotation that the file's metadata
		// does not show must still be read at the next exchange.
		mod := time.Date(2025, 1, 1, 0, 0, 0, 0, time.UTC)
		if err := os.Chtimes(path, mod, mod); err != nil {
			t.Fatal(err)
		}
	}
	write(tok)
	return &platform.FileToken{Path: path}, write
}

func exchangeFor(f *fakeSTS, ext platform.TokenSource, clk *testutil.Clock) *platform.ExchangeToken {
	return &platform.ExchangeToken{STSURL: f.srv.URL, Identity: "org1/ident7", Audience: "https://api.test",
		ExternalToken: ext, Now: clk.Now}
}

func TestExchangeToken_CachesUntilShortlyBeforeExpiry(t *testing.T) {
	for _, tc := range []struct {
		name     string
		lifetime time.Duration // 0: the answer has no expiry
		layout   string
		renew    time.Duration // when the token is exchanged again
	}{
		// A minute before expiry, or a tenth of the lifetime when shorter.
		{"TenMinutes", 10 * time.Minute, "2006-01-02T15:04:05.000Z07:00", 9 * time.Minute},
		{"FiveMinutesNanos", 5 * time.Minute, "2006-01-02T15:04:05.000000000Z07:00", 4*time.Minute + 30*time.Second},
		// No expiry: an hour, as the vendor's SDK assumes.
		{"NoExpiry", 0, "", 59 * time.Minute},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clk := newClock()
			f := newFakeSTS(t, func(n int, w http.ResponseWriter) {
				exp := ""
				if tc.lifetime > 0 {
					exp = clk.Now().Add(tc.lifetime).Format(tc.layout)
				}
				tokenAnswer(w, n, exp)
			})
			ext, rotate := externalFile(t, "external-aaaa")
			x := exchangeFor(f, ext, clk)
			get := func(want string) {
				t.Helper()
				got, err := x.Token(ctxT(t))
				if err != nil || got != want {
					t.Fatalf("Token = %q, %v; want %q", got, err, want)
				}
			}
			get("exchanged-1")
			get("exchanged-1")
			rotate("external-bbbb")
			clk.Advance(tc.renew - time.Second)
			get("exchanged-1")
			clk.Advance(time.Second)
			get("exchanged-2")
			if got, want := f.count(), 2; got != want {
				t.Errorf("%d exchanges, want %d", got, want)
			}
			// The external token is read afresh at each exchange, though
			// the file's size and mtime did not change.
			if got := f.externals; len(got) != 2 || got[0] != "external-aaaa" || got[1] != "external-bbbb" {
				t.Errorf("external tokens presented: %q", got)
			}
			x.Invalidate() // a refusal
			get("exchanged-3")
		})
	}
}

func TestExchangeToken_ConcurrentCallersShareOneExchange(t *testing.T) {
	clk := newClock()
	release := make(chan struct{})
	f := newFakeSTS(t, func(n int, w http.ResponseWriter) {
		<-release
		tokenAnswer(w, n, clk.Now().Add(time.Hour).Format(time.RFC3339))
	})
	x := exchangeFor(f, platform.StaticToken("external-cccc"), clk)
	var wg sync.WaitGroup
	got := make([]string, 16)
	errs := make([]error, 16)
	for i := range got {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got[i], errs[i] = x.Token(ctxT(t))
		}()
	}
	// The exchange is held until it has reached the STS, so the callers
	// started meanwhile find it in flight rather than cached.
	deadline := time.Now().Add(10 * time.Second)
	for f.count() == 0 && time.Now().Before(deadline) {
		runtime.Gosched()
	}
	close(release)
	wg.Wait()
	for i := range got {
		if errs[i] != nil || got[i] != "exchanged-1" {
			t.Fatalf("caller %d: %q, %v", i, got[i], errs[i])
		}
	}
	if n := f.count(); n != 1 {
		t.Errorf("%d exchanges for 16 concurrent callers, want 1", n)
	}
}

func TestExchangeToken_RefusalNamesIdentityAudienceAndAnswer(t *testing.T) {
	clk := newClock()
	f := newFakeSTS(t, func(n int, w http.ResponseWriter) {
		w.WriteHeader(http.StatusUnauthorized)
		fmt.Fprint(w, `{"code":16,"message":"token subject \"system:serviceaccount:ns:other\" does not match the identity"}`)
	})
	x := exchangeFor(f, platform.StaticToken("external-dddd"), clk)
	_, err := x.Token(ctxT(t))
	var ae *platform.AuthError
	if !errors.As(err, &ae) || !platform.IsAuthError(err) {
		t.Fatalf("err = %v, want an *AuthError", err)
	}
	if ae.Status != 401 || ae.Audience != "https://api.test" || !strings.Contains(ae.Credential, "org1/ident7") {
		t.Errorf("AuthError = %+v", ae)
	}
	msg := err.Error()
	for _, want := range []string{"identity exchange of org1/ident7", "audience https://api.test", "401", "does not match the identity", "claimMatch"} {
		if !strings.Contains(msg, want) {
			t.Errorf("message %q lacks %q", msg, want)
		}
	}
	if strings.Contains(msg, "external-dddd") {
		t.Errorf("message %q shows the external token", msg)
	}
	// A refusal is not cached as a token: the next call asks again.
	if _, err := x.Token(ctxT(t)); err == nil || f.count() != 2 {
		t.Errorf("second call: %v after %d exchanges; want another refused exchange", err, f.count())
	}
}

func TestExchangeToken_UnavailableIsAskedAgain(t *testing.T) {
	clk := newClock()
	f := newFakeSTS(t, func(n int, w http.ResponseWriter) {
		if n == 1 {
			w.WriteHeader(http.StatusServiceUnavailable)
			fmt.Fprint(w, `{"code":14,"message":"datastore busy"}`)
			return
		}
		// The SDK's spelling of the refresh token is accepted too.
		fmt.Fprintf(
			w,
			`{"token":"exchanged-%d","refresh_token":"r","expiry":%q}`,
			n,
			clk.Now().Add(time.Hour).Format(time.RFC3339),
		)
	})
	x := exchangeFor(f, platform.StaticToken("external-eeee"), clk)
	if got, err := x.Token(ctxT(t)); err != nil || got != "exchanged-2" {
		t.Fatalf("Token = %q, %v; want the second answer's token", got, err)
	}
}

func TestExchangeToken_ExternalTokenUnreadable(t *testing.T) {
	f := newFakeSTS(t, func(n int, w http.ResponseWriter) { tokenAnswer(w, n, "") })
	x := exchangeFor(f, &platform.FileToken{Path: filepath.Join(t.TempDir(), "missing")}, newClock())
	_, err := x.Token(context.Background())
	if !platform.IsAuthError(err) || !strings.Contains(err.Error(), "external token") || f.count() != 0 {
		t.Errorf("err = %v after %d exchanges; want an AuthError about the external token and no exchange", err, f.count())
	}
}
