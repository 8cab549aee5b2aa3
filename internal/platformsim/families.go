package platformsim

import "strings"

// Tag families the v2 tag list hides unless asked
// (proto/chainguard/platform/registry/v2/tags.proto, ListTagsRequest).
const (
	FamilyReferrers = "referrers" // "sha256-*": signatures, attestations
	FamilyDates     = "dates"     // "*-20yymmdd"
	FamilyEpochs    = "epochs"    // "*-r[0-9]+"
)

// TagFamily returns the hidden family a tag name belongs to, or "" for an
// ordinary tag that every listing shows.
func TagFamily(name string) string {
	switch {
	case strings.HasPrefix(name, "sha256-"):
		return FamilyReferrers
	case isDateSuffixed(name):
		return FamilyDates
	case isEpochSuffixed(name):
		return FamilyEpochs
	}
	return ""
}

// isDateSuffixed matches "*-20yymmdd".
func isDateSuffixed(name string) bool {
	const n = len("-20yymmdd")
	if len(name) < n {
		return false
	}
	tail := name[len(name)-n:]
	return strings.HasPrefix(tail, "-20") && allDigits(tail[3:])
}

// isEpochSuffixed matches "*-r[0-9]+".
func isEpochSuffixed(name string) bool {
	i := strings.LastIndex(name, "-r")
	return i >= 0 && allDigits(name[i+2:])
}

func allDigits(s string) bool {
	if s == "" {
		return false
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return true
}

// familyFilter is which hidden families a tag listing includes.
type familyFilter struct {
	hide                     bool // Options.HideTagFamilies
	referrers, dates, epochs bool
}

func (f familyFilter) shows(name string) bool {
	if !f.hide {
		return true
	}
	switch TagFamily(name) {
	case FamilyReferrers:
		return f.referrers
	case FamilyDates:
		return f.dates
	case FamilyEpochs:
		return f.epochs
	}
	return true
}
