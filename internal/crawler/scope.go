package crawler

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"

	"github.com/syncd-dev/syncd/internal/platform"
)

// Families are the tag families the v2 tag list leaves out unless asked
// for (include_dates, include_epochs, include_referrers). Every listing,
// the sweep and pushes use the same set, so a tag is either mirrored
// everywhere or nowhere.
type Families struct {
	Dates     bool // tags *-20yymmdd
	Epochs    bool // tags *-r<N>
	Referrers bool // tags sha256-*: signatures and attestations
}

// ParseFamilies reads [crawl] tag_families ("dates", "epochs",
// "referrers"); config validation has refused anything else.
func ParseFamilies(names []string) Families {
	var f Families
	for _, n := range names {
		switch n {
		case "dates":
			f.Dates = true
		case "epochs":
			f.Epochs = true
		case "referrers":
			f.Referrers = true
		}
	}
	return f
}

var (
	dateTag  = regexp.MustCompile(`-20[0-9]{6}$`)
	epochTag = regexp.MustCompile(`-r[0-9]+$`)
)

// Includes reports whether a tag named name is listed with these families:
// tags of no family always are.
func (f Families) Includes(name string) bool {
	switch {
	case strings.HasPrefix(name, "sha256-"):
		return f.Referrers
	case dateTag.MatchString(name):
		return f.Dates
	case epochTag.MatchString(name):
		return f.Epochs
	}
	return true
}

// tagQuery is a tag listing that shows the configured families.
func (f Families) tagQuery(q platform.ListQuery) platform.ListQuery {
	q.IncludeDates, q.IncludeEpochs, q.IncludeReferrers = f.Dates, f.Epochs, f.Referrers
	return q
}

// paths computes repos' registry paths: the names of every uid segment
// below the root group, joined by "/" (a repo directly below the root is
// its name; one below the subgroup "charts" is "charts/<name>"). Names of
// subgroups are asked for once and kept.
type paths struct {
	root   string
	client *platform.Client

	mu    sync.Mutex
	names map[string]string // uid of a group or repo below root: its name
}

func newPaths(root string, client *platform.Client) *paths {
	return &paths{root: root, client: client, names: make(map[string]string)}
}

// learn records a repo's name, which a repo nested below it needs.
func (p *paths) learn(uid, name string) {
	p.mu.Lock()
	p.names[uid] = name
	p.mu.Unlock()
}

// of returns the registry path of the repo uid named name.
func (p *paths) of(ctx context.Context, uid, name string) (string, error) {
	// Learnt first: repos may be nested below this one.
	p.learn(uid, name)
	parent := uid[:max(strings.LastIndexByte(uid, '/'), 0)]
	if parent == p.root || p.root == "" {
		return name, nil // the common case asks for nothing
	}
	if !strings.HasPrefix(uid, p.root+"/") {
		return "", fmt.Errorf("repo %s is not below the root group %s: its registry path is unknown", uid, p.root)
	}
	// Ancestors' names, nearest the root first.
	segs := strings.Split(strings.TrimPrefix(uid, p.root+"/"), "/")
	at := p.root
	for _, seg := range segs[:len(segs)-1] {
		at += "/" + seg
		if _, ok := p.name(at); ok {
			continue
		}
		// A segment is a group or, where repos nest, a repo.
		name, err := p.segmentName(ctx, at)
		if err != nil {
			return "", readErr(fmt.Errorf("registry path of repo %s: name of %s above it: %w", uid, at, err))
		}
		p.learn(at, name)
	}
	return platform.RegistryPath(p.root, uid, p.name)
}

// segmentName asks for the name of the group, or failing that the repo,
// whose uid is uid.
func (p *paths) segmentName(ctx context.Context, uid string) (string, error) {
	g, err := p.client.GetGroup(ctx, uid)
	if err == nil {
		return g.Name, nil
	}
	if !platform.IsNotFound(err) {
		return "", err
	}
	r, rerr := p.client.GetRepo(ctx, uid)
	if rerr != nil {
		return "", errors.Join(err, rerr)
	}
	return r.Name, nil
}

func (p *paths) name(uid string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ok := p.names[uid]
	return n, ok
}
