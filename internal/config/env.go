package config

import (
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"
)

// applyEnv sets every field named by a SYNCD_<SECTION>_<KEY> variable. It
// returns the variable that set each dotted key, so that later errors
// about the key name it, and an error for every variable that could not be
// applied.
func applyEnv(cfg *Config, environ []string) (fromEnv map[string]string, errs Errors) {
	env := make(map[string]string)
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && strings.HasPrefix(k, "SYNCD_") {
			env[k] = v
		}
	}
	if len(env) == 0 {
		return nil, nil
	}
	fromEnv = make(map[string]string)
	known := make(map[string]bool)
	root := reflect.ValueOf(cfg).Elem()
	for i := 0; i < root.NumField(); i++ {
		section := root.Type().Field(i).Tag.Get("toml")
		sv := root.Field(i)
		for j := 0; j < sv.NumField(); j++ {
			key := sv.Type().Field(j).Tag.Get("toml")
			name := "SYNCD_" + strings.ToUpper(section) + "_" + strings.ToUpper(key)
			known[name] = true
			v, ok := env[name]
			if !ok {
				continue
			}
			fromEnv[section+"."+key] = name
			if err := setField(sv.Field(j), v); err != nil {
				errs = append(errs, &Error{Source: name, Key: section + "." + key, Msg: err.Error()})
			}
		}
	}
	var unknown []string
	for name := range env {
		if !known[name] && !strings.HasPrefix(name, "SYNCD_TEST_") {
			unknown = append(unknown, name)
		}
	}
	slices.Sort(unknown)
	for _, name := range unknown {
		errs = append(
			errs,
			&Error{
				Source: name,
				Msg:    "unknown environment override (want SYNCD_<SECTION>_<KEY> for a key in config.example.toml)",
			},
		)
	}
	return fromEnv, errs
}

func setField(f reflect.Value, v string) error {
	if u, ok := f.Addr().Interface().(interface{ UnmarshalText([]byte) error }); ok {
		return u.UnmarshalText([]byte(v))
	}
	switch f.Kind() {
	case reflect.String:
		f.SetString(v)
	case reflect.Int:
		n, err := strconv.Atoi(v)
		if err != nil {
			return fmt.Errorf("not an integer: %q", v)
		}
		f.SetInt(int64(n))
	case reflect.Float64:
		n, err := strconv.ParseFloat(v, 64)
		if err != nil {
			return fmt.Errorf("not a number: %q", v)
		}
		f.SetFloat(n)
	case reflect.Bool:
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("not a boolean: %q", v)
		}
		f.SetBool(b)
	case reflect.Slice:
		var items []string
		for _, s := range strings.Split(v, ",") {
			if s = strings.TrimSpace(s); s != "" {
				items = append(items, s)
			}
		}
		f.Set(reflect.ValueOf(items))
	default:
		return fmt.Errorf("cannot set a %s from the environment", f.Kind())
	}
	return nil
}
