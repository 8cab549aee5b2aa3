package platformsim

import "strings"

// Registry paths. A repo's path in the registry is the chain of names of its
// uid's segments below the root group, each segment being a group or a repo
// (platform-examples image-copy-ecr resolveRepositoryName): repo
// org1/<g>/<r> under group "charts" named "cert-manager" is
// <org>/charts/cert-manager. Paths are computed, not stored, so renaming a
// group moves every repo below it, as upstream.

// pathLocked returns the registry path of a resource below the root group,
// without the organization.
func (s *Sim) pathLocked(uid string) (string, bool) {
	root := s.opts.RootGroup
	if !isDescendant(uid, root) {
		return "", false
	}
	segs := strings.Split(uid[len(root)+1:], "/")
	names := make([]string, len(segs))
	prefix := root
	for i, seg := range segs {
		prefix += "/" + seg
		switch {
		case s.groups[prefix] != nil:
			names[i] = s.groups[prefix].name
		case s.repos[prefix] != nil:
			names[i] = s.repos[prefix].name
		default:
			return "", false
		}
	}
	return strings.Join(names, "/"), true
}

// repoByPathLocked finds the organization's repo at a registry path.
func (s *Sim) repoByPathLocked(path string) *repo {
	last := path[strings.LastIndexByte(path, '/')+1:]
	at := func(rp *repo) bool {
		if rp.name != last {
			return false
		}
		p, ok := s.pathLocked(rp.uid)
		return ok && p == path
	}
	if v, ok := s.atPath.Load(path); ok {
		if rp := v.(*repo); s.repos[rp.uid] == rp && at(rp) {
			return rp
		}
	}
	for _, rp := range s.repos {
		if at(rp) {
			s.atPath.Store(path, rp)
			return rp
		}
	}
	return nil
}

// RegistryPath returns a repo's registry path below the organization, for
// example "charts/cert-manager".
func (s *Sim) RegistryPath(repoUID string) (string, bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	if _, ok := s.repos[repoUID]; !ok {
		return "", false
	}
	return s.pathLocked(repoUID)
}
