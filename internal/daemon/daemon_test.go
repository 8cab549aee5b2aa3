package daemon_test

import (
	"errors"
	"testing"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/crawler"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platform"
)

func TestParseSchedules(t *testing.T) {
	c := config.Default().Crawl
	c.SweepSchedule = ""
	jobs, err := daemon.ParseSchedules(c)
	if err != nil {
		t.Fatal(err)
	}
	if jobs[crawler.JobCrawl] == nil || jobs[crawler.JobAdvisories] == nil {
		t.Errorf("jobs=%v, want the crawl and advisories schedules", jobs)
	}
	if _, ok := jobs[crawler.JobSweep]; ok {
		t.Error("an empty sweep_schedule turns the sweep off, but it has a schedule")
	}
	c.Schedule = "every so often"
	var ce daemon.ConfigError
	if _, err := daemon.ParseSchedules(c); !errors.As(err, &ce) {
		t.Errorf("err=%v, want a ConfigError", err)
	}
}

func TestTokenSources(t *testing.T) {
	p := config.Default().Platform
	p.BaseURL, p.RegistryURL = "https://api.example.com", "https://cgr.example.com"
	t.Run("Tokens", func(t *testing.T) {
		p := p
		p.Token, p.RegistryTokenFile = "t", "/run/registry-token"
		api, reg := daemon.TokenSources(p)
		if api != platform.StaticToken("t") {
			t.Errorf("api=%#v, want the static token", api)
		}
		if f, ok := reg.(*platform.FileToken); !ok || f.Path != "/run/registry-token" {
			t.Errorf("registry=%#v, want the file", reg)
		}
	})
	t.Run("NoRegistryCredential", func(t *testing.T) {
		if _, reg := daemon.TokenSources(p); reg != nil {
			t.Errorf("registry=%#v, want none (the client offers the platform token)", reg)
		}
	})
	t.Run("IdentityExchangesPerAudience", func(t *testing.T) {
		p := p
		p.Identity, p.IdentityTokenFile, p.STSURL = "org1/abc", "/run/oidc", "https://issuer.example.com"
		api, reg := daemon.TokenSources(p)
		a, ok1 := api.(*platform.ExchangeToken)
		r, ok2 := reg.(*platform.ExchangeToken)
		if !ok1 || !ok2 || a.Audience != daemon.APIAudience(p) || r.Audience != daemon.RegistryAudience(p) ||
			a.Audience == r.Audience {
			t.Errorf("api=%#v registry=%#v, want one exchange per audience", api, reg)
		}
	})
}
