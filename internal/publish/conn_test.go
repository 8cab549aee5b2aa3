package publish_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"

	"github.com/syncd-dev/syncd/internal/publish"
	"github.com/syncd-dev/syncd/internal/testutil"
)

// TestConnect_CheckStreamOnly is manage_stream = false: a missing stream is
// a clear error naming the stream and the account; an existing stream that
// someone else created is used as it is.
func TestConnect_CheckStreamOnly(t *testing.T) {
	ctx := context.Background()
	srv := startServer(t, nil)
	cfg := srv.config(nil)
	cfg.CheckStreamOnly = true

	_, err := publish.Connect(ctx, cfg)
	if !errors.Is(err, publish.ErrStreamNotFound) {
		t.Fatalf("Connect without the stream = %v, want ErrStreamNotFound", err)
	}
	for _, want := range []string{`stream "SYNCD"`, `account "$G"`, "manage_stream", "syncd.>"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}

	// An administrator creates the stream, with settings of their own.
	admin := mustConnect(t, srv.config(nil))
	if err := admin.JS.DeleteStream(ctx, testStream); err != nil {
		t.Fatal(err)
	}
	// The server removes a deleted stream's files after it answers, and
	// a new stream of the same name fails while it does ("error creating
	// store for stream"): the administrator tries again.
	testutil.Eventually(t, 10*time.Second, func() error {
		_, err := admin.JS.CreateStream(
			ctx,
			jetstream.StreamConfig{Name: testStream, Subjects: []string{"other.>"}, MaxMsgs: 1000},
		)
		return err
	})
	if _, err := publish.Connect(ctx, cfg); err == nil || !strings.Contains(err.Error(), `does not capture "syncd.>"`) {
		t.Fatalf("Connect with a stream of other subjects = %v, want an error saying it does not capture syncd.>", err)
	}
	if _, err := admin.JS.UpdateStream(
		ctx,
		jetstream.StreamConfig{Name: testStream, Subjects: []string{"other.>", "syncd.>"}, MaxMsgs: 1000},
	); err != nil {
		t.Fatal(err)
	}
	conn := mustConnect(t, cfg)
	st := mustOpenStore(t)
	newProducer(t, st).addRepos(ctx, "r", 2, 1)
	if err := publish.NewRelay(conn.JS, st, cfg).Flush(ctx); err != nil {
		t.Fatalf("flush: %v", err)
	}
	info, err := conn.JS.Stream(ctx, testStream)
	if err != nil {
		t.Fatal(err)
	}
	// Two repo.created, two tag.created and their history.recorded.
	if got, want := info.CachedInfo().State.Msgs, uint64(6); got != want {
		t.Errorf("stream holds %d messages, want %d", got, want)
	}
	if got := info.CachedInfo().Config.MaxMsgs; got != 1000 {
		t.Errorf("stream MaxMsgs = %d: syncd changed a stream it may not manage", got)
	}
}

// TestConnect_CheckStreamOnlyNamedAccount checks that the error names the
// account the credentials belong to.
func TestConnect_CheckStreamOnlyNamedAccount(t *testing.T) {
	team := server.NewAccount("TEAM")
	srv := startServer(t, func(o *server.Options) {
		o.Accounts = []*server.Account{team}
		o.Users = []*server.User{{Username: "syncd", Password: "hunter2", Account: team}}
	})
	acc, err := srv.Server.LookupAccount("TEAM")
	if err != nil {
		t.Fatal(err)
	}
	if err := acc.EnableJetStream(
		map[string]server.JetStreamAccountLimits{"": {MaxMemory: -1, MaxStore: -1, MaxStreams: -1, MaxConsumers: -1}},
		nil,
	); err != nil {
		t.Fatal(err)
	}
	cfg := srv.config(nil)
	cfg.CheckStreamOnly, cfg.User, cfg.Password = true, "syncd", "hunter2"
	_, err = publish.Connect(context.Background(), cfg)
	if !errors.Is(err, publish.ErrStreamNotFound) || !strings.Contains(err.Error(), `account "TEAM"`) {
		t.Fatalf("Connect = %v, want ErrStreamNotFound naming account TEAM", err)
	}
	if strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error reveals the password: %v", err)
	}
}

// TestConnect_Auth connects with each way to authenticate, checks that a
// wrong secret fails at start, and that no secret ever reaches the log,
// across a disconnection and reconnection.
func TestConnect_Auth(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	const token, password = "tok-s3cret-4711", "pw-s3cret-0815"
	seedFile := filepath.Join(t.TempDir(), "user.nk")
	kp, err := nkeys.CreateUser()
	if err != nil {
		t.Fatal(err)
	}
	seed, _ := kp.Seed()
	pub, _ := kp.PublicKey()
	if err := os.WriteFile(seedFile, seed, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		server func(*server.Options)
		client func(*publish.Config)
		wrong  func(*publish.Config)
	}{
		{"Token",
			func(o *server.Options) { o.Authorization = token },
			func(c *publish.Config) { c.Token = token },
			func(c *publish.Config) { c.Token = "not-" + token }},
		{"UserPassword",
			func(o *server.Options) { o.Username, o.Password = "syncd", password },
			func(c *publish.Config) { c.User, c.Password = "syncd", password },
			func(c *publish.Config) { c.User, c.Password = "syncd", "not-"+password }},
		{"TokenInURL",
			func(o *server.Options) { o.Authorization = token },
			func(c *publish.Config) { c.URL = strings.Replace(c.URL, "nats://", "nats://"+token+"@", 1) },
			func(c *publish.Config) { c.URL = strings.Replace(c.URL, "nats://", "nats://not-"+token+"@", 1) }},
		{"NKeySeed",
			func(o *server.Options) { o.Nkeys = []*server.NkeyUser{{Nkey: pub}} },
			func(c *publish.Config) { c.NKeySeed = seedFile },
			nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuffer
			srv := startServer(t, tc.server)
			cfg := srv.config(logs.logger())
			if tc.wrong != nil {
				bad := cfg
				tc.wrong(&bad)
				if _, err := publish.Connect(context.Background(), bad); err == nil {
					t.Fatal("Connect with a wrong secret succeeded")
				} else if strings.Contains(err.Error(), token) || strings.Contains(err.Error(), password) {
					t.Errorf("error reveals a secret: %v", err)
				}
			}
			tc.client(&cfg)
			conn := mustConnect(t, cfg)
			srv.Stop()
			testutil.WaitFor(t, 5*time.Second, "the disconnection", func() bool { return !conn.NC.IsConnected() })
			srv.Start()
			testutil.WaitFor(t, 10*time.Second, "the reconnection", func() bool { return conn.NC.IsConnected() })
			conn.Close()
			out := logs.String()
			for _, want := range []string{"NATS connected", "NATS disconnected", "NATS reconnected", "NATS connection closed"} {
				if !strings.Contains(out, want) {
					t.Errorf("log lacks %q", want)
				}
			}
			if strings.Contains(out, token) || strings.Contains(out, password) || strings.Contains(out, string(seed)) {
				t.Errorf("log reveals a secret:\n%s", out)
			}
		})
	}
}

// TestConnect_TLS connects over TLS with a private CA and a client
// certificate, which the server requires.
func TestConnect_TLS(t *testing.T) {
	dir := t.TempDir()
	ca, caKey := newCA(t)
	writePEM(t, filepath.Join(dir, "ca.pem"), "CERTIFICATE", ca.Raw)
	for _, name := range []string{"server", "client"} {
		der, key := newLeaf(t, ca, caKey, name)
		writePEM(t, filepath.Join(dir, name+".pem"), "CERTIFICATE", der)
		kb, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, filepath.Join(dir, name+"-key.pem"), "EC PRIVATE KEY", kb)
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{
		CertFile: filepath.Join(dir, "server.pem"), KeyFile: filepath.Join(dir, "server-key.pem"),
		CaFile: filepath.Join(dir, "ca.pem"), Verify: true,
	})
	if err != nil {
		t.Fatal(err)
	}
	srv := startServer(t, func(o *server.Options) { o.TLS, o.TLSVerify, o.TLSConfig = true, true, tc })

	cfg := srv.config(nil)
	cfg.TLSCA = filepath.Join(dir, "ca.pem")
	if _, err := publish.Connect(context.Background(), cfg); err == nil {
		t.Fatal("Connect without a client certificate succeeded, though the server requires one")
	}
	cfg.TLSCert, cfg.TLSKey = filepath.Join(dir, "client.pem"), filepath.Join(dir, "client-key.pem")
	conn := mustConnect(t, cfg)
	if _, err := conn.NC.TLSConnectionState(); err != nil {
		t.Fatalf("connection is not TLS: %v", err)
	}
	st := mustOpenStore(t)
	newProducer(t, st).addRepos(context.Background(), "tls", 1, 1)
	if err := publish.NewRelay(conn.JS, st, cfg).Flush(context.Background()); err != nil {
		t.Fatalf("flush over TLS: %v", err)
	}
}

func TestRedactURL(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"nats://127.0.0.1:4222", "nats://127.0.0.1:4222"},
		{"nats://tok@127.0.0.1:4222", "nats://xxxxx@127.0.0.1:4222"},
		{"nats://u:p@a:4222,tls://b:4222", "nats://u:xxxxx@a:4222,tls://b:4222"},
	} {
		if got := publish.RedactURL(tc.in); got != tc.want {
			t.Errorf("RedactURL(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

func newCA(t *testing.T) (*x509.Certificate, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "syncd test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return ca, key
}

func newLeaf(t *testing.T, ca *x509.Certificate, caKey *ecdsa.PrivateKey, name string) ([]byte, *ecdsa.PrivateKey) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, DNSNames: []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &key.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	return der, key
}

func writePEM(t *testing.T, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestConnect_AuthErrorsOnReconnectDoNotCloseTheConnection: a server that
// comes back refusing the credentials (a password changed, an account not
// loaded yet) refuses every reconnection; nats.go's default closes the
// connection for good at the second refusal, leaving the process up with
// no connection. The connection keeps trying, logs the refusals, and
// reconnects once the server accepts the credentials again.
func TestConnect_AuthErrorsOnReconnectDoNotCloseTheConnection(t *testing.T) {
	t.Parallel() // a server of its own; it mostly waits
	const password = "pw-s3cret-0815"
	var logs logBuffer
	srv := startServer(t, func(o *server.Options) { o.Username, o.Password = "syncd", password })
	cfg := srv.config(logs.logger())
	cfg.User, cfg.Password = "syncd", password
	conn := mustConnect(t, cfg)

	srv.Stop()
	srv.Configure(func(o *server.Options) { o.Password = "changed-pw-9999" })
	srv.Start()
	testutil.WaitFor(t, 15*time.Second, "three refused reconnections", func() bool {
		return strings.Count(strings.ToLower(logs.String()), "authorization violation") >= 3
	})
	if conn.NC.IsClosed() {
		t.Fatal("the connection was closed after its reconnections were refused")
	}
	if s := conn.Status(); s != nats.RECONNECTING {
		t.Errorf("status while the reconnections are refused: %s, want %s", s, nats.RECONNECTING)
	}

	srv.Stop()
	srv.Configure(func(o *server.Options) { o.Password = password })
	srv.Start()
	testutil.WaitFor(t, 15*time.Second, "the reconnection", func() bool { return conn.Status() == nats.CONNECTED })
	conn.NC.Close()
	testutil.WaitFor(t, 15*time.Second, "the closed status", func() bool { return conn.Status() == nats.CLOSED })
	if strings.Contains(logs.String(), password) {
		t.Errorf("log reveals the password:\n%s", logs.String())
	}
}

// TestConn_StatusDoesNotWaitOnABlockedWrite: a server that stops reading
// (a network that drops every packet) blocks the client's write, which
// holds the connection's lock until WriteTimeout; the client's own
// IsConnected and Status wait on that lock. Conn.Status, what readiness
// and the connected gauge read, answers at once.
func TestConn_StatusDoesNotWaitOnABlockedWrite(t *testing.T) {
	srv := startServer(t, nil)
	proxy := testutil.NewFaultProxy(t, strings.TrimPrefix(srv.URL(), "nats://"))
	cfg := configFor("nats://"+proxy.Addr(), nil)
	cfg.WriteTimeout = time.Minute
	c := mustConnect(t, cfg)
	if s := c.Status(); s != nats.CONNECTED {
		t.Fatalf("status after connecting: %s", s)
	}

	proxy.Stall()
	var since atomic.Int64 // when the publish under way began; 0: none
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		payload := make([]byte, 512<<10)
		for {
			select {
			case <-stop:
				return
			default:
			}
			since.Store(time.Now().UnixNano())
			err := c.NC.Publish("blocked.writes", payload)
			since.Store(0)
			if err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		close(stop)
		proxy.Heal()
		c.NC.Close() // ends the blocked write
		<-done
	})
	testutil.Eventually(t, 30*time.Second, func() error {
		if at := since.Load(); at == 0 || time.Since(time.Unix(0, at)) < 500*time.Millisecond {
			return errors.New("no publish has been blocked for 500ms yet")
		}
		return nil
	})

	got := make(chan nats.Status, 1)
	go func() { got <- c.Status() }()
	select {
	case s := <-got:
		if s != nats.CONNECTED {
			t.Errorf("status with a write blocked: %s, want %s (nothing reported the connection lost)", s, nats.CONNECTED)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Status still waits after 5 s while a write is blocked")
	}
}
