package preflight

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/syncd-dev/syncd/internal/config"
	"github.com/syncd-dev/syncd/internal/daemon"
	"github.com/syncd-dev/syncd/internal/platform"
	"github.com/syncd-dev/syncd/internal/publish"
)

// ErrSkipped marks a check that had nothing to check; its detail says why.
var ErrSkipped = errors.New("skipped")

// Check is one check: what it checks, and the check, which returns what it
// found (or, with ErrSkipped, why it checked nothing).
type Check struct {
	Subject string
	Run     func(ctx context.Context) (detail string, err error)
}

// Checks are the checks of cfg, in order: the platform API, the registry
// (on an image the first check found), and NATS. Its error is a
// configuration the platform client refuses.
func Checks(cfg config.Config, log *slog.Logger) ([]Check, error) {
	pc := &platformCheck{cfg: cfg}
	client, err := daemon.NewClient(cfg, log, pc.observe)
	if err != nil {
		return nil, err
	}
	pc.client = client
	p := cfg.Platform
	return []Check{
		{
			fmt.Sprintf("platform API %s, %s for audience %s", p.BaseURL, daemon.APICredential(p), daemon.APIAudience(p)),
			pc.api,
		},
		{
			fmt.Sprintf(
				"registry %s, %s for audience %s",
				p.RegistryURL,
				daemon.RegistryCredential(p),
				daemon.RegistryAudience(p),
			),
			pc.registry,
		},
		{natsSubject(cfg.NATS), func(ctx context.Context) (string, error) { return checkNATS(ctx, cfg) }},
	}, nil
}

// platformCheck checks the two platform credentials: the API's, then the
// registry's on an image the first check found.
type platformCheck struct {
	cfg    config.Config
	client *platform.Client
	// image and tag are what the registry check reads; image.Name is ""
	// when the group has no repo.
	image platform.Image
	tag   string
	// apiErr is the platform check's failure.
	apiErr error
	// lastStatus is the status of the latest answer (0: none came), to
	// explain a check that ran out of time while retrying.
	lastStatus atomic.Int64
}

func (pc *platformCheck) observe(_ string, code int, _ bool) { pc.lastStatus.Store(int64(code)) }

// api lists one repo of the group, and one tag of it for the registry check.
func (pc *platformCheck) api(ctx context.Context) (string, error) {
	detail, err := pc.findImage(ctx)
	pc.apiErr = err
	return detail, err
}

func (pc *platformCheck) findImage(ctx context.Context) (string, error) {
	group := pc.cfg.Platform.Group
	repo, found, err := firstItem(ctx, pc.client.Repos(platform.ListQuery{DescendantsOf: group, PageSize: 1}))
	if err != nil {
		return "", pc.explain(ctx, err, "platform.base_url")
	}
	if !found {
		return fmt.Sprintf("group %s is readable, and holds no repo yet", group), nil
	}
	path, err := pc.registryPath(ctx, repo)
	if err != nil {
		return "", pc.explain(ctx, err, "platform.base_url")
	}
	pc.image = pc.client.PrivateImage(path)
	tag, found, err := firstItem(ctx, pc.client.Tags(platform.ListQuery{ChildrenOf: repo.UID, PageSize: 1}))
	if err != nil {
		return "", pc.explain(ctx, err, "platform.base_url")
	}
	if found {
		pc.tag = tag.Name
	}
	return fmt.Sprintf("group %s is readable (repo %s listed)", group, pc.image.Path()), nil
}

// registry reads the history of the tag api found, or asks /token for the
// image when it has no tag.
func (pc *platformCheck) registry(ctx context.Context) (string, error) {
	if pc.image.Name == "" {
		why := "the group holds no repo whose image to read"
		if pc.apiErr != nil {
			why = "it reads an image the platform check finds, and that check failed"
		}
		return pc.obtainOnly(ctx, why)
	}
	if pc.tag == "" {
		if _, err := pc.client.RegistryToken(ctx, pc.image); err != nil {
			return "", pc.explain(ctx, err, "platform.registry_url")
		}
		return fmt.Sprintf("a pull token for %s was issued (the repo has no tag whose history to read)", pc.image.Path()), nil
	}
	// A start of now asks for no record, so the answer is small and still
	// needs the credential to be accepted for this image.
	if _, err := pc.client.TagHistory(ctx, pc.image, pc.tag, time.Now(), time.Time{}); err != nil {
		return "", pc.explain(ctx, err, "platform.registry_url")
	}
	return fmt.Sprintf("the tag history of %s:%s is readable", pc.image.Path(), pc.tag), nil
}

// obtainOnly gets the registry credential without presenting it, since
// there is no image to present it for: an identity's exchange for the
// registry audience, a file read or a command run still shows whether
// that part works.
func (pc *platformCheck) obtainOnly(ctx context.Context, why string) (string, error) {
	_, reg := daemon.TokenSources(pc.cfg.Platform)
	if reg == nil {
		return why, ErrSkipped
	}
	if _, err := reg.Token(ctx); err != nil {
		return "", fmt.Errorf("could not obtain the credential: %w", err)
	}
	return "the credential was obtained, but not presented: " + why, ErrSkipped
}

// registryPath is the repo's path in the registry: its name below the root
// group, else the names of the groups between them too.
func (pc *platformCheck) registryPath(ctx context.Context, repo platform.Repo) (string, error) {
	root := pc.cfg.Platform.Group
	names := map[string]string{repo.UID: repo.Name}
	rest, _ := strings.CutPrefix(repo.UID, root+"/")
	segs := strings.Split(rest, "/")
	at := root
	for _, seg := range segs[:len(segs)-1] {
		at += "/" + seg
		g, err := pc.client.GetGroup(ctx, at)
		if err != nil {
			return "", err
		}
		names[at] = g.Name
	}
	return platform.RegistryPath(root, repo.UID, func(uid string) (string, bool) { n, ok := names[uid]; return n, ok })
}

// explain says what to fix about err. A refused credential explains itself
// (platform.AuthError names the credential, its audience and the key to
// set); a check that ran out of time says what the last attempt got.
func (pc *platformCheck) explain(ctx context.Context, err error, urlKey string) error {
	if platform.IsAuthError(err) || ctx.Err() == nil {
		return err
	}
	last := "no answer came (is the host reachable?)"
	if code := pc.lastStatus.Load(); code != 0 {
		last = fmt.Sprintf("the last answer was %d %s", code, http.StatusText(int(code)))
	}
	return fmt.Errorf(
		"no success within the time allowed, %s: check %s and the network, or retry with a longer --timeout [%w]",
		last,
		urlKey,
		err,
	)
}

// firstItem returns the first item of a listing: with a page size of 1, one
// request.
func firstItem[T any](ctx context.Context, l *platform.Lister[T]) (T, bool, error) {
	var zero T
	for page, err := range l.Pages(ctx) {
		if err != nil {
			return zero, false, err
		}
		if len(page) > 0 {
			return page[0], true, nil
		}
	}
	return zero, false, nil
}

// checkNATS connects to [nats] url and makes one JetStream round trip: the
// account's info, or the stream syncd may not create.
func checkNATS(ctx context.Context, cfg config.Config) (string, error) {
	n := cfg.NATS
	if n.URL == "" {
		return fmt.Sprintf(
			"\"syncd run\" starts it in-process, storing under %s; nothing to reach",
			filepath.Join(filepath.Dir(cfg.Store.Path), "nats"),
		), ErrSkipped
	}
	pcfg := daemon.NATSConfig(cfg, slog.New(slog.DiscardHandler))
	pcfg.FailFast = true
	conn, err := publish.Dial(ctx, pcfg)
	if err != nil {
		return "", fmt.Errorf("%w: check that the server runs and nats.url, and the credentials and TLS keys of [nats]", err)
	}
	defer conn.Close()
	if !n.ManageStream {
		if err := publish.CheckStream(ctx, conn.JS, pcfg); err != nil {
			return "", err
		}
		return fmt.Sprintf("connected; stream %s exists and captures %s.>", n.Stream, n.SubjectPrefix), nil
	}
	info, err := conn.JS.AccountInfo(ctx)
	if err != nil {
		return "", fmt.Errorf("JetStream account info: %w: JetStream must be enabled for the account syncd connects as", err)
	}
	return fmt.Sprintf(
		"connected; JetStream answers (%d streams in the account; syncd creates or updates %s)",
		info.Streams,
		n.Stream,
	), nil
}

func natsSubject(n config.NATS) string {
	if n.URL == "" {
		return "NATS (embedded)"
	}
	return "NATS " + publish.RedactURL(n.URL)
}
