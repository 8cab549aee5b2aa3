package config

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"strings"

	"github.com/BurntSushi/toml"
)

// Load returns Default overlaid with the file at path (skipped when path is
// empty) and then with environment variables from environ (os.Environ form).
// The result is validated. Its error is an Errors listing every problem
// found: a file that cannot be read or parsed stops at that one, but
// unknown keys, bad environment overrides and invalid values are all
// reported together.
func Load(path string, environ []string) (Config, error) {
	return load(path, environ, nil)
}

// LoadForPlatform is Load followed by RequirePlatform, with the problems
// of both in one list: what a command that talks to a real platform (not
// the demo) checks before anything else.
func LoadForPlatform(path string, environ []string) (Config, error) {
	return load(path, environ, (*Config).RequirePlatform)
}

// LoadForDemo is Load followed by RequireDemo, with the problems of both
// in one list, each naming its line or variable: what "syncd run --demo"
// checks before anything else.
func LoadForDemo(path string, environ []string) (Config, error) {
	return load(path, environ, (*Config).RequireDemo)
}

// load is Load, then require (when not nil) on the result.
func load(path string, environ []string, require func(*Config) error) (Config, error) {
	cfg := Default()
	var src []byte
	var found Errors
	if path != "" {
		var err error
		if src, err = os.ReadFile(path); err != nil {
			return cfg, Errors{{Source: path, Msg: fmt.Sprintf("read config: %v", err)}}
		}
		unknown, stop := decode(&cfg, path, src)
		if stop != nil {
			return cfg, Errors{stop}
		}
		found = append(found, unknown...)
	}
	fromEnv, envErrs := applyEnv(&cfg, environ)
	found = append(found, envErrs...)
	var invalid, missing Errors
	if errors.As(cfg.Validate(), &invalid) {
		found = append(found, invalid...)
	}
	if require != nil && errors.As(require(&cfg), &missing) {
		found = append(found, missing...)
	}
	if len(found) > 0 {
		found.locate(path, src, fromEnv)
		return cfg, found
	}
	return cfg, nil
}

// decode reads src into cfg. A syntax or type error stops decoding and is
// returned alone; keys syncd does not know do not, and are returned
// together.
func decode(cfg *Config, path string, src []byte) (unknown Errors, err *Error) {
	md, derr := toml.NewDecoder(bytes.NewReader(src)).Decode(cfg)
	if derr != nil {
		return nil, decodeError(path, derr)
	}
	for _, k := range md.Undecoded() {
		key := k.String()
		unknown = append(unknown, &Error{Source: path, Line: keyLine(src, key), Key: key,
			Msg: "unknown key (see config.example.toml for the keys syncd knows)"})
	}
	return unknown, nil
}

// typeErr is how the decoder words a type mismatch: 'toml: line N (last key "k"): msg'.
var typeErr = regexp.MustCompile(`^toml: (?:line (\d+) )?\(last key "([^"]+)"\): (.*)$`)

// decodeError turns the decoder's error into an Error with the line.
func decodeError(path string, err error) *Error {
	var pe toml.ParseError
	if ppe := (*toml.ParseError)(nil); errors.As(err, &ppe) {
		pe = *ppe
	} else if !errors.As(err, &pe) {
		if m := typeErr.FindStringSubmatch(err.Error()); m != nil {
			line, _ := strconv.Atoi(m[1])
			return &Error{Source: path, Line: line, Key: m[2], Msg: m[3]}
		}
		return &Error{Source: path, Msg: err.Error()}
	}
	msg := pe.Message
	if msg == "" {
		msg = pe.Error()
	}
	return &Error{Source: path, Line: pe.Position.Line, Key: pe.LastKey, Msg: msg}
}

// keyLine finds the line where a dotted key is set in TOML source, so that
// errors found after decoding can still point at the file. 0 when not found.
func keyLine(src []byte, key string) int {
	parts := strings.Split(key, ".")
	if len(parts) == 0 {
		return 0
	}
	section, name := strings.Join(parts[:len(parts)-1], "."), parts[len(parts)-1]
	cur := ""
	sc := bufio.NewScanner(bytes.NewReader(src))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if strings.HasPrefix(line, "[") {
			if cur = strings.Trim(line, "[] \t"); cur == key {
				return n
			}
			continue
		}
		k, _, ok := strings.Cut(line, "=")
		if !ok {
			continue
		}
		k = strings.Trim(strings.TrimSpace(k), `"`)
		if (cur == section && k == name) || (cur == "" && k == key) {
			return n
		}
	}
	return 0
}
