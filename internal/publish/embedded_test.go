package publish_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/syncd-dev/syncd/internal/publish"
)

// TestDial_EmbeddedListenWantsCredentials: the embedded server does not
// take clients beyond loopback without credentials; with credentials set,
// an anonymous client is refused (one such client deleted stream SYNCD),
// syncd's own connection and a client presenting them are not, and the
// secret is never logged.
func TestDial_EmbeddedListenWantsCredentials(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	embedded := func(listen string) publish.Config {
		return publish.Config{DataDir: t.TempDir(), Listen: listen, SubjectPrefix: testPrefix, Stream: testStream,
			MaxAge: time.Hour, DuplicateWindow: time.Minute, Replicas: 1}
	}
	t.Run("PublicWithoutCredentials", func(t *testing.T) {
		c, err := publish.Connect(ctx, embedded("0.0.0.0:0"))
		if err == nil {
			c.Close()
			t.Fatal("Connect listening on 0.0.0.0 without credentials succeeded, want a refusal")
		}
		if !strings.Contains(err.Error(), "0.0.0.0:0") || !strings.Contains(err.Error(), "credentials") {
			t.Errorf("error %q, want it to name the address and the missing credentials", err)
		}
	})
	const secret = "s3cret-embedded-token"
	for _, tc := range []struct {
		name   string
		set    func(*publish.Config)
		client nats.Option
	}{
		{"Token", func(c *publish.Config) { c.Token = secret }, nats.Token(secret)},
		{"UserPassword", func(c *publish.Config) { c.User, c.Password = "syncd", secret }, nats.UserInfo("syncd", secret)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var logs logBuffer
			cfg := embedded("127.0.0.1:0")
			cfg.Logger = logs.logger()
			tc.set(&cfg)
			c, err := publish.Connect(ctx, cfg)
			if err != nil {
				t.Fatalf("Connect with credentials: %v", err)
			}
			defer c.Close()
			url := c.Server.ClientURL()
			if nc, err := nats.Connect(url); err == nil {
				nc.Close()
				t.Fatal("an anonymous client connected to the embedded server, want it refused")
			}
			nc, err := nats.Connect(url, tc.client)
			if err != nil {
				t.Fatalf("a client with the credentials: %v", err)
			}
			nc.Close()
			if _, err := c.JS.Stream(ctx, testStream); err != nil {
				t.Errorf("syncd's own connection: %v", err)
			}
			if strings.Contains(logs.String(), secret) {
				t.Errorf("the log holds the secret:\n%s", logs.String())
			}
		})
	}
}
