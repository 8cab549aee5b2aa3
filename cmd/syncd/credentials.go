package main

import (
	"log/slog"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/platform"
)

// credentials returns the token source of each audience: the platform
// API's, and the registry's (nil when none is configured, and the client
// falls back to asking the registry with the platform token). An identity
// gives both by token exchange.
func credentials(p config.Platform) (api, registry platform.TokenSource) {
	if p.Identity != "" {
		external := &platform.FileToken{Path: p.IdentityTokenFile}
		exchange := func(aud string) platform.TokenSource {
			return &platform.ExchangeToken{STSURL: p.STSURL, Identity: p.Identity, Audience: aud, ExternalToken: external}
		}
		return exchange(apiAudience(p)), exchange(registryAudience(p))
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

// apiAudience is the platform API's audience: api_audience, or the base URL.
func apiAudience(p config.Platform) string {
	if p.APIAudience != "" {
		return p.APIAudience
	}
	return platform.DefaultAPIAudience(p.BaseURL)
}

// registryAudience is the registry's audience: registry_audience, or the
// registry's host[:port].
func registryAudience(p config.Platform) string {
	if p.RegistryAudience != "" {
		return p.RegistryAudience
	}
	return platform.DefaultRegistryAudience(p.RegistryURL)
}

// newClient is the platform client every command uses, built from cfg.
// registryURL stands in for [platform] registry_url where a command never
// reaches the registry and the config may leave it out.
func newClient(cfg config.Config, log *slog.Logger, observe func(endpoint string, code int, retry bool)) (*platform.Client, error) {
	p := cfg.Platform
	if p.RegistryURL == "" {
		p.RegistryURL = p.BaseURL
	}
	api, registry := credentials(p)
	return platform.New(platform.Config{
		BaseURL: p.BaseURL, RegistryURL: p.RegistryURL, Token: api, PullToken: registry,
		APIAudience: apiAudience(p), RegistryAudience: registryAudience(p),
		Organization: p.Organization, PublicOrg: p.PublicOrg, Vendor: p.Vendor,
		Timeout: p.Timeout.Duration, RequestsPerSecond: cfg.Crawl.RequestsPerSecond, MaxInFlight: cfg.Crawl.Concurrency, Logger: log.With("part", "platform"),
		Observe: observe,
	})
}
