package platformsim

import (
	"encoding/hex"
	"fmt"
	"strings"
	"time"
)

// The simulator keeps times as Unix milliseconds: the API's resolution, and
// eight bytes per history record instead of a time.Time's twenty-four.

// histRec is one tag history record, stored compactly because scale
// scenarios hold a million of them.
type histRec struct {
	ms     int64
	digest [32]byte
}

type group struct {
	uid, name, description string
	createMs, updateMs     int64
}

type repo struct {
	uid, name, description string
	catalogTier            string
	aliases, activeTags    []string
	bundles                []string
	createMs, updateMs     int64
	tags                   map[string]*tag // by uid
	idx                    int             // position in Sim.repoList
}

type tag struct {
	uid, repoUID, name string
	digest             [32]byte
	deprecated         bool
	bundles            []string
	createMs, updateMs int64
	history            []histRec // oldest first
	idx                int       // position in Sim.tagList
}

type advisory struct {
	uid, advisoryID, artifactName string
	createMs, updateMs            int64
	deleteMs                      int64 // withdrawn at; 0 while live
	idx                           int   // position in Sim.advList

	author, artifactType, artifactArch              string
	componentName, componentLocation, componentType string
	legacyID                                        string
	aliases                                         []string
	severities                                      []severity
	events                                          []*advEvent // oldest first
	// version is the artifact's version when the vulnerability was
	// detected; fixed and patched versions follow it.
	version string
}

type identity struct {
	uid, name, description string
	issuer, subject        string
	audience               string // claimMatch.audience; "" for the default
	lastSeenMs             int64
	createMs, updateMs     int64
}

type role struct {
	uid, name, description string
	capabilities           []string
	createMs, updateMs     int64
}

type roleBinding struct {
	uid, identityUID, roleUID string
	createMs, updateMs        int64
}

type subscription struct {
	uid, sink          string
	createMs, updateMs int64
}

// publicImage is an image of the public organization; it is only reachable
// through the registry, never through the platform API of the simulated org.
type publicImage struct {
	name string
	tags map[string]*tag // by tag name
}

// parentOf returns the parent part of a hierarchical uid ("" for a root).
func parentOf(uid string) string {
	i := strings.LastIndexByte(uid, '/')
	if i < 0 {
		return ""
	}
	return uid[:i]
}

// isDescendant reports whether uid lies anywhere below ancestor.
func isDescendant(uid, ancestor string) bool {
	return len(uid) > len(ancestor) && strings.HasPrefix(uid, ancestor) && uid[len(ancestor)] == '/'
}

const timeLayout = "2006-01-02T15:04:05.000Z"

func fmtMs(ms int64) string {
	if ms == 0 {
		return ""
	}
	return time.UnixMilli(ms).UTC().Format(timeLayout)
}

// parseTime accepts RFC 3339 with or without fractional seconds.
func parseTime(v string) (int64, error) {
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		return 0, err
	}
	return t.UnixMilli(), nil
}

func fmtDigest(d [32]byte) string {
	return "sha256:" + hex.EncodeToString(d[:])
}

func parseDigest(v string) ([32]byte, error) {
	var d [32]byte
	h, ok := strings.CutPrefix(v, "sha256:")
	if !ok || len(h) != 64 {
		return d, fmt.Errorf("digest %q is not of the form sha256:<64 hex>", v)
	}
	if _, err := hex.Decode(d[:], []byte(h)); err != nil {
		return d, fmt.Errorf("digest %q: %w", v, err)
	}
	return d, nil
}
