package daemon

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/platform"
)

// NewClient is the platform client every command uses, built from cfg;
// observe (may be nil) is told of every answer. A missing [platform]
// registry_url stands in as base_url, for commands that never reach the
// registry.
func NewClient(
	cfg config.Config,
	log *slog.Logger,
	observe func(endpoint string, code int, retry bool),
) (*platform.Client, error) {
	return newClient(cfg, log, observe, 0)
}

// newClient is NewClient whose requests retry for maxRetry (0: the
// client's default).
func newClient(
	cfg config.Config,
	log *slog.Logger,
	observe func(endpoint string, code int, retry bool),
	maxRetry time.Duration,
) (*platform.Client, error) {
	p := cfg.Platform
	if p.RegistryURL == "" {
		p.RegistryURL = p.BaseURL
	}
	api, registry := TokenSources(p)
	return platform.New(platform.Config{
		BaseURL:           p.BaseURL,
		RegistryURL:       p.RegistryURL,
		Token:             api,
		PullToken:         registry,
		APIAudience:       APIAudience(p),
		RegistryAudience:  RegistryAudience(p),
		Organization:      p.Organization,
		PublicOrg:         p.PublicOrg,
		Vendor:            p.Vendor,
		Timeout:           p.Timeout.Duration,
		RequestsPerSecond: cfg.Crawl.RequestsPerSecond,
		MaxInFlight:       cfg.Crawl.Concurrency,
		Logger:            log.With("part", "platform"),
		Observe:           observe,
		MaxRetryTime:      maxRetry,
	})
}

// TokenSources returns the token source of each audience: the platform
// API's, and the registry's (nil when none is configured, and the client
// falls back to asking the registry with the platform token). An identity
// gives both by token exchange.
func TokenSources(p config.Platform) (api, registry platform.TokenSource) {
	if p.Identity != "" {
		external := &platform.FileToken{Path: p.IdentityTokenFile}
		exchange := func(aud string) platform.TokenSource {
			return &platform.ExchangeToken{STSURL: p.STSURL, Identity: p.Identity, Audience: aud, ExternalToken: external}
		}
		return exchange(APIAudience(p)), exchange(RegistryAudience(p))
	}
	switch {
	case p.TokenFile != "":
		api = &platform.FileToken{Path: p.TokenFile}
	case p.TokenCommand != "":
		api = &platform.CommandToken{Command: p.TokenCommand}
	default:
		api = platform.StaticToken(p.Token)
	}
	switch {
	case p.RegistryToken != "":
		registry = platform.StaticToken(p.RegistryToken)
	case p.RegistryTokenFile != "":
		registry = &platform.FileToken{Path: p.RegistryTokenFile}
	case p.RegistryTokenCommand != "":
		registry = &platform.CommandToken{Command: p.RegistryTokenCommand}
	case p.RegistryCredentialHelper != "":
		registry = &platform.DockerCredentialHelper{Helper: p.RegistryCredentialHelper, Host: p.RegistryHost()}
	}
	return api, registry
}

// APIAudience is the platform API's audience: api_audience, or the base URL.
func APIAudience(p config.Platform) string {
	if p.APIAudience != "" {
		return p.APIAudience
	}
	return platform.DefaultAPIAudience(p.BaseURL)
}

// RegistryAudience is the registry's audience: registry_audience, or the
// registry's host[:port].
func RegistryAudience(p config.Platform) string {
	if p.RegistryAudience != "" {
		return p.RegistryAudience
	}
	return platform.DefaultRegistryAudience(p.RegistryURL)
}

// APICredential names where the platform API credential comes from.
func APICredential(p config.Platform) string {
	switch {
	case p.Identity != "":
		return fmt.Sprintf("token of identity %s exchanged at %s", p.Identity, p.STSURL)
	case p.TokenFile != "":
		return "platform token from platform.token_file"
	case p.TokenCommand != "":
		return "platform token from platform.token_command"
	}
	return "platform token from platform.token"
}

// RegistryCredential names where the registry credential comes from.
func RegistryCredential(p config.Platform) string {
	switch {
	case p.Identity != "":
		return fmt.Sprintf("token of identity %s exchanged at %s", p.Identity, p.STSURL)
	case p.RegistryToken != "":
		return "registry token from platform.registry_token"
	case p.RegistryTokenFile != "":
		return "registry token from platform.registry_token_file"
	case p.RegistryTokenCommand != "":
		return "registry token from platform.registry_token_command"
	case p.RegistryCredentialHelper != "":
		return "registry token from docker-credential-" + p.RegistryCredentialHelper
	}
	return "no registry credential (the platform token is offered to /token)"
}
