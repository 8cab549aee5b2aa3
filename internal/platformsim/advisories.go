package platformsim

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"time"
)

// Advisories follow advisories.proto: the artifact and the component inside
// it, the CVE and GHSA ids (aliases), CVSS severities, and a lifecycle of
// events. Each event is one kind of the proto's oneof: detection (by a
// scanner, the NVD API or by hand), then as analysis goes on a true or false
// positive determination, a fix pending upstream, analysis or a fix not
// planned, patched, or fixed at a version.

// The kinds of advisory event, by the JSON name the gateway gives the
// oneof's member.
const (
	EventDetection          = "detection"
	EventFixed              = "fixed"
	EventFalsePositive      = "falsePositiveDetermination"
	EventTruePositive       = "truePositiveDetermination"
	EventAnalysisNotPlanned = "analysisNotPlanned"
	EventFixNotPlanned      = "fixNotPlanned"
	EventPendingUpstreamFix = "pendingUpstreamFix"
	EventPatched            = "patched"
)

// EventKinds lists every advisory event kind, in the proto's order.
func EventKinds() []string {
	return []string{EventDetection, EventFixed, EventFalsePositive, EventAnalysisNotPlanned,
		EventFixNotPlanned, EventPendingUpstreamFix, EventTruePositive, EventPatched}
}

// eventTypeFilters maps the proto's EventTypeFilter names (and numbers) to
// event kinds, for the list's event_types and latest_event_type.
var eventTypeFilters = map[string]string{
	"EVENT_TYPE_FILTER_DETECTION": EventDetection, "1": EventDetection,
	"EVENT_TYPE_FILTER_TRUE_POSITIVE_DETERMINATION": EventTruePositive, "2": EventTruePositive,
	"EVENT_TYPE_FILTER_FIXED": EventFixed, "3": EventFixed,
	"EVENT_TYPE_FILTER_FALSE_POSITIVE_DETERMINATION": EventFalsePositive, "4": EventFalsePositive,
	"EVENT_TYPE_FILTER_ANALYSIS_NOT_PLANNED": EventAnalysisNotPlanned, "5": EventAnalysisNotPlanned,
	"EVENT_TYPE_FILTER_FIX_NOT_PLANNED": EventFixNotPlanned, "6": EventFixNotPlanned,
	"EVENT_TYPE_FILTER_PENDING_UPSTREAM_FIX": EventPendingUpstreamFix, "7": EventPendingUpstreamFix,
	"EVENT_TYPE_FILTER_PATCHED": EventPatched, "8": EventPatched,
}

// Review states of an advisory event.
const (
	ReviewPending  = "REVIEW_STATE_PENDING"
	ReviewApproved = "REVIEW_STATE_APPROVED"
)

// The ways a detection is made: the members of Detection's own oneof.
const (
	DetectionScan   = "scanv1"
	DetectionNVDAPI = "nvdapi"
	DetectionManual = "manual"
)

type severity struct{ typ, score string }

// advEvent is one event of an advisory's lifecycle.
type advEvent struct {
	uid                                  string
	createMs                             int64
	author, reviewer, reviewState, issue string
	findings                             []byte
	kind                                 string
	// The kind's fields: how a detection was made and what it matched (a
	// scan's or the NVD API's fields, by JSON name, in order), a note, the
	// fixed version, a false positive's type, the patched versions.
	how                    string
	match                  [][2]string
	note, fixedVersion, fp string
	patched                []string
}

// approved reports whether the event counts for the advisory's state.
func (e *advEvent) approved() bool { return e.reviewState == ReviewApproved }

// latestApproved is the kind of a's most recent approved event, "" if none.
func (a *advisory) latestApproved() string {
	for i := len(a.events) - 1; i >= 0; i-- {
		if a.events[i].approved() {
			return a.events[i].kind
		}
	}
	return ""
}

// advisoryRand is the generator of one advisory's details. It is seeded by
// the advisory's uid, not drawn from the simulator's generator, so that
// populations and scenarios draw exactly what they drew before advisories
// had details.
func advisoryRand(seed int64, uid string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(uid))
	return rand.New(rand.NewPCG(uint64(seed), h.Sum64()))
}

// component is a kind of package an advisory can be about.
type component struct{ name, typ, location string }

var components = []component{
	{"openssl", "apk", "/usr/lib/libssl.so.3"},
	{"libcurl", "apk", "/usr/lib/libcurl.so.4"},
	{"zlib", "apk", "/usr/lib/libz.so.1"},
	{"golang.org/x/net", "go-module", "/usr/bin/app"},
	{"golang.org/x/crypto", "go-module", "/usr/bin/app"},
	{"stdlib", "go-module", "/usr/bin/app"},
	{"requests", "python", "/usr/lib/python3.12/site-packages/requests"},
	{"jackson-databind", "java-archive", "/usr/share/java/jackson-databind.jar"},
	{"glibc", "apk", "/usr/lib/libc.so.6"},
	{"busybox", "apk", "/bin/busybox"},
}

// cvssVectors are realistic CVSS v3.1 base vectors, from critical to low.
var cvssVectors = []string{
	"CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:H/I:H/A:H", // 9.8
	"CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:C/C:H/I:H/A:H", // 10.0
	"CVSS:3.1/AV:N/AC:L/PR:N/UI:N/S:U/C:N/I:N/A:H", // 7.5
	"CVSS:3.1/AV:L/AC:L/PR:L/UI:N/S:U/C:H/I:H/A:H", // 7.8
	"CVSS:3.1/AV:N/AC:H/PR:N/UI:N/S:U/C:H/I:N/A:N", // 5.9
	"CVSS:3.1/AV:N/AC:L/PR:N/UI:R/S:C/C:L/I:L/A:N", // 6.1
	"CVSS:3.1/AV:L/AC:H/PR:L/UI:N/S:U/C:L/I:N/A:N", // 2.5
	"CVSS:3.1/AV:N/AC:L/PR:L/UI:N/S:U/C:N/I:N/A:L", // 4.3
}

var cvssV2Vectors = []string{"AV:N/AC:L/Au:N/C:P/I:P/A:P", "AV:N/AC:M/Au:N/C:N/I:P/A:N", "AV:L/AC:L/Au:N/C:C/I:C/A:C"}

var cvssV4Vectors = []string{
	"CVSS:4.0/AV:N/AC:L/AT:N/PR:N/UI:N/VC:H/VI:H/VA:H/SC:N/SI:N/SA:N",
	"CVSS:4.0/AV:L/AC:L/AT:N/PR:L/UI:N/VC:H/VI:N/VA:N/SC:N/SI:N/SA:N",
}

// fillAdvisory draws a's details (artifact, component, aliases, severities)
// and its first event, a detection at a.createMs. cvePool bounds the CVE
// numbers, so that one CVE often concerns several artifacts, as upstream.
func fillAdvisory(rng *rand.Rand, a *advisory, cvePool int, domain string) {
	c := components[rng.IntN(len(components))]
	a.author = "advisories@" + domain
	a.artifactType = "apk"
	if rng.IntN(5) == 0 {
		a.artifactType = "image"
	}
	a.artifactArch = [...]string{"x86_64", "aarch64"}[rng.IntN(2)]
	a.componentName, a.componentType, a.componentLocation = c.name, c.typ, c.location
	year := 2022 + rng.IntN(4)
	a.aliases = []string{fmt.Sprintf("CVE-%d-%d", year, 10000+rng.IntN(max(cvePool, 1)))}
	if rng.IntN(2) == 0 {
		a.aliases = append(a.aliases, "GHSA-"+ghsaPart(rng)+"-"+ghsaPart(rng)+"-"+ghsaPart(rng))
	}
	if rng.IntN(5) == 0 {
		a.legacyID = advisoryID(rng)
	}
	a.severities = []severity{{"TYPE_CVSS_V3", cvssVectors[rng.IntN(len(cvssVectors))]}}
	if rng.IntN(3) == 0 {
		a.severities = append([]severity{{"TYPE_CVSS_V2", cvssV2Vectors[rng.IntN(len(cvssV2Vectors))]}}, a.severities...)
	}
	if rng.IntN(5) == 0 {
		a.severities = append(a.severities, severity{"TYPE_CVSS_V4", cvssV4Vectors[rng.IntN(len(cvssV4Vectors))]})
	}
	a.version = fmt.Sprintf("%d.%d.%d-r%d", 1+rng.IntN(3), rng.IntN(20), rng.IntN(10), rng.IntN(4))
	a.events = []*advEvent{detection(rng, a, a.createMs)}
}

func ghsaPart(rng *rand.Rand) string {
	const alphabet = "23456789cfghjmpqrvwx"
	b := make([]byte, 4)
	for i := range b {
		b[i] = alphabet[rng.IntN(len(alphabet))]
	}
	return string(b)
}

// detection is a's detection at ms: mostly by a scan, sometimes by the NVD
// API or by hand.
func detection(rng *rand.Rand, a *advisory, ms int64) *advEvent {
	e := newEvent(rng, a, EventDetection, ms)
	switch x := rng.IntN(10); {
	case x < 7:
		e.how = DetectionScan
		e.author = "scanner@" + a.author[len("advisories@"):]
		e.match = [][2]string{
			{"scanner", "grype"},
			{"subpackage", a.artifactName},
			{"componentId", fmt.Sprintf("%016x", rng.Uint64())},
			{
				"component",
				a.componentName,
			},
			{"componentVersion", fmt.Sprintf("%d.%d.%d", rng.IntN(4), rng.IntN(30), rng.IntN(20))},
			{"componentType", a.componentType},
			{"componentLocation", a.componentLocation},
			{"artifactVersion", a.version},
			{
				"scannerVersion",
				"0.87.0",
			},
			{"grypeDbBuilt", time.UnixMilli(ms).UTC().Truncate(24 * time.Hour).Format(time.RFC3339)},
			{"grypeDbChecksum", fmt.Sprintf("sha256:%016x", rng.Uint64())},
		}
		e.findings, _ = json.Marshal(map[string]any{"matcher": a.componentType + "-matcher", "package": a.componentName,
			"vulnerability": a.aliases[0]})
	case x < 9:
		e.how = DetectionNVDAPI
		e.match = [][2]string{
			{"cpeSearched", a.componentName},
			{"cpeFound", "cpe:2.3:a:" + a.componentName + ":" + a.componentName + ":*:*:*:*:*:*:*:*"},
		}
	default:
		e.how = DetectionManual
	}
	return e
}

// newEvent is an approved event of a's of the given kind at ms.
func newEvent(rng *rand.Rand, a *advisory, kind string, ms int64) *advEvent {
	return &advEvent{uid: a.uid + "/" + newSegmentFrom(rng), createMs: ms, kind: kind,
		author: "analyst@" + a.author[len("advisories@"):], reviewState: ReviewApproved}
}

// nextKinds are the steps that follow an advisory's state (the kind of its
// latest approved event), weighted. Fixed, patched and false positives end
// a lifecycle.
var nextKinds = map[string][]struct {
	kind   string
	weight int
}{
	EventDetection: {
		{EventFixed, 4},
		{EventFalsePositive, 2},
		{EventTruePositive, 2},
		{EventPendingUpstreamFix, 1},
		{EventAnalysisNotPlanned, 1},
	},
	EventTruePositive:       {{EventFixed, 3}, {EventPendingUpstreamFix, 2}, {EventPatched, 1}, {EventFixNotPlanned, 1}},
	EventPendingUpstreamFix: {{EventFixed, 3}, {EventPatched, 1}},
	EventAnalysisNotPlanned: {{EventTruePositive, 1}, {EventFalsePositive, 1}},
	EventFixNotPlanned:      {{EventFixed, 1}},
}

// nextKind draws the step after state, "" when the lifecycle has ended.
func nextKind(rng *rand.Rand, state string) string {
	steps := nextKinds[state]
	total := 0
	for _, s := range steps {
		total += s.weight
	}
	if total == 0 {
		return ""
	}
	x := rng.IntN(total)
	for _, s := range steps {
		if x < s.weight {
			return s.kind
		}
		x -= s.weight
	}
	return ""
}

// step is a's next event of the given kind at ms; version, when set, is a
// fixed step's version or a patched step's one patched version.
func step(rng *rand.Rand, a *advisory, kind, version string, ms int64) *advEvent {
	if kind == EventDetection {
		return detection(rng, a, ms)
	}
	e := newEvent(rng, a, kind, ms)
	if version == "" {
		version = nextVersion(a.version, 1+rng.IntN(2))
	}
	switch kind {
	case EventFixed:
		e.fixedVersion, e.note = version, "fixed upstream in "+version
	case EventPatched:
		e.patched, e.note = []string{version}, "patch applied"
	case EventFalsePositive:
		e.fp = [...]string{"TYPE_COMPONENT_VULNERABILITY_MISMATCH", "TYPE_VULNERABLE_CODE_NOT_IN_EXECUTION_PATH",
			"TYPE_VULNERABLE_CODE_VERSION_NOT_USED", "TYPE_VULNERABILITY_RECORD_ANALYSIS_CONTESTED"}[rng.IntN(4)]
		e.note = "not exploitable in " + a.artifactName
	case EventTruePositive:
		e.note = "the vulnerable code is reachable"
	case EventPendingUpstreamFix:
		e.note = "waiting for an upstream release"
	case EventFixNotPlanned:
		e.note = "the package is end of life"
	case EventAnalysisNotPlanned:
		// No note: protojson renders the empty message as {}.
	}
	if rng.IntN(8) == 0 {
		e.issue = fmt.Sprintf("cve-dashboard#%d", 1+rng.IntN(50000))
	}
	return e
}

// nextVersion is the version n epochs after v ("1.2.3-r0" -> "1.2.3-r1").
func nextVersion(v string, n int) string {
	var a, b, c, r int
	if _, err := fmt.Sscanf(v, "%d.%d.%d-r%d", &a, &b, &c, &r); err != nil {
		return v + fmt.Sprintf("-r%d", n)
	}
	return fmt.Sprintf("%d.%d.%d-r%d", a, b, c, r+n)
}

// growLifecycle adds to a, as Populate generates it, the steps that
// followed its detection, spread between its creation and updateMs; the
// last is pending review now and then.
func growLifecycle(rng *rand.Rand, a *advisory) {
	steps := rng.IntN(4) // 0 to 3 more steps
	for i := 1; i <= steps; i++ {
		kind := nextKind(rng, a.latestApproved())
		if kind == "" {
			break
		}
		ms := a.createMs + (a.updateMs-a.createMs)*int64(i)/int64(steps)
		a.events = append(a.events, step(rng, a, kind, "", ms))
	}
	if last := a.events[len(a.events)-1]; len(a.events) > 1 && rng.IntN(8) < 2 {
		last.reviewState = ReviewPending
	}
	a.updateMs = max(a.updateMs, a.events[len(a.events)-1].createMs)
}

// renderEvent is e as the gateway renders it: the oneof as one member
// holding the kind's fields; in protojson mode zero values are left out
// but the member never is, an empty message being {}.
func (s *Sim) renderEvent(e *advEvent) map[string]any {
	str := func(m map[string]any, k, v string) {
		if v != "" || !s.opts.ProtoJSON {
			m[k] = v
		}
	}
	m := map[string]any{"uid": e.uid}
	ct := fmtMs(e.createMs)
	if s.opts.ProtoJSON {
		ct = protoTime(ct, e.uid)
	}
	m["createTime"] = ct
	str(m, "author", e.author)
	str(m, "reviewer", e.reviewer)
	str(m, "reviewState", e.reviewState)
	if e.issue != "" {
		m["issue"] = e.issue // optional: absent when unset, in either mode
	}
	if len(e.findings) > 0 {
		m["findings"] = e.findings // bytes: base64, as protojson writes them
	} else if !s.opts.ProtoJSON {
		m["findings"] = ""
	}
	member := map[string]any{}
	switch e.kind {
	case EventDetection:
		how := map[string]any{}
		for _, kv := range e.match {
			str(how, kv[0], kv[1])
		}
		member[e.how] = how
	case EventFixed:
		str(member, "fixedVersion", e.fixedVersion)
		str(member, "note", e.note)
	case EventPatched:
		if len(e.patched) > 0 || !s.opts.ProtoJSON {
			member["patchedVersions"] = append([]string{}, e.patched...)
		}
		str(member, "note", e.note)
	case EventFalsePositive:
		str(member, "type", e.fp)
		str(member, "note", e.note)
	default:
		str(member, "note", e.note)
	}
	m[e.kind] = member
	return m
}
