package configs

import (
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"

	"github.com/fleetgate/fleetgate/gateway"
)

// EnvPrefix starts every environment override: FLEETGATE_<SECTION>_<KEY>,
// the key's path upper-cased with dots as underscores
// (FLEETGATE_STORE_REDIS_ADDRS for store.redis.addrs).
const EnvPrefix = "FLEETGATE_"

// TestBootIDEnv overrides the boot ID the outbox keys its entries' ages
// on (/proc/sys/kernel/random/boot_id), so that a test can simulate a
// reboot. It is a test hook, not a configuration key: Load checks its
// form and otherwise ignores it; TestBootID reads it.
const TestBootIDEnv = EnvPrefix + "TEST_BOOT_ID"

// TestBootID returns the value of TestBootIDEnv in env ("" when unset).
func TestBootID(env []string) string {
	for _, kv := range env {
		if name, val, ok := strings.Cut(kv, "="); ok && name == TestBootIDEnv {
			return val
		}
	}
	return ""
}

// leaf is one settable key of Config.
type leaf struct {
	path  string // "store.redis.addrs"
	index []int  // for reflect.Value.FieldByIndex
}

// EnvName returns the variable that overrides the key at path.
func EnvName(path string) string {
	return EnvPrefix + strings.ToUpper(strings.ReplaceAll(path, ".", "_"))
}

// leaves lists every key of Config that holds a value, in struct order.
func leaves() []leaf {
	var out []leaf
	var walk func(t reflect.Type, path string, index []int)
	walk = func(t reflect.Type, path string, index []int) {
		for i := range t.NumField() {
			f := t.Field(i)
			p := join(path, yamlName(f))
			idx := append(index[:len(index):len(index)], i)
			if f.Type.Kind() == reflect.Struct {
				walk(f.Type, p, idx)
				continue
			}
			out = append(out, leaf{path: p, index: idx})
		}
	}
	walk(reflect.TypeFor[Config](), "", nil)
	return out
}

// applyEnv sets every FLEETGATE_ variable of env on c. A variable that
// names no key, or whose value does not parse, is an error naming it.
func applyEnv(c *Config, env []string) error {
	all := leaves()
	byName := make(map[string]leaf, len(all))
	names := make([]string, 0, len(all))
	for _, l := range all {
		byName[EnvName(l.path)] = l
		names = append(names, EnvName(l.path))
	}
	v := reflect.ValueOf(c).Elem()
	var errs []error
	for _, kv := range env {
		name, val, ok := strings.Cut(kv, "=")
		if !ok || !strings.HasPrefix(name, EnvPrefix) {
			continue
		}
		if name == TestBootIDEnv {
			if _, err := gateway.ParseBootID(val); err != nil {
				errs = append(errs, fmt.Errorf("environment %s (a test hook): %w", name, err))
			}
			continue
		}
		l, ok := byName[name]
		if !ok {
			errs = append(errs, fmt.Errorf("environment %s: no such configuration key%s", name, suggest(name, names)))
			continue
		}
		if err := setString(v.FieldByIndex(l.index), val); err != nil {
			errs = append(errs, fmt.Errorf("environment %s (%s): %w", name, l.path, err))
		}
	}
	return errors.Join(errs...)
}

// setString sets a leaf from an environment value: strings as they are,
// lists split at commas (empty: an empty list), numbers, booleans and
// durations parsed.
func setString(v reflect.Value, s string) error {
	switch {
	case v.Type() == durationType:
		d, err := parseDuration(s)
		if err != nil {
			return err
		}
		v.Set(reflect.ValueOf(d))
	case v.Type() == byteSizeType:
		var b ByteSize
		if err := b.UnmarshalText([]byte(s)); err != nil {
			return err
		}
		v.Set(reflect.ValueOf(b))
	case v.Type() == adapterListType:
		v.Set(reflect.ValueOf(adapterNames(s)))
	case v.Kind() == reflect.Slice && v.Type().Elem().Kind() == reflect.Struct:
		return errors.New("a list of entries: set it in the configuration file")
	case v.Type() == stringListType:
		list := []string{}
		if s != "" {
			list = strings.Split(s, ",")
			for i := range list {
				list[i] = strings.TrimSpace(list[i])
			}
		}
		v.Set(reflect.ValueOf(list))
	case v.Kind() == reflect.String:
		v.SetString(s)
	case v.Kind() == reflect.Int:
		i, err := strconv.Atoi(s)
		if err != nil {
			return fmt.Errorf("want an integer, got %q", s)
		}
		v.SetInt(int64(i))
	case v.Kind() == reflect.Bool:
		b, err := strconv.ParseBool(s)
		if err != nil {
			return fmt.Errorf("want true or false, got %q", s)
		}
		v.SetBool(b)
	default:
		panic("configs: unsupported type " + v.Type().String())
	}
	return nil
}

// Keys lists the path of every configuration key ("store.redis.addrs"), in
// the order of the file.
func Keys() []string {
	ls := leaves()
	out := make([]string, len(ls))
	for i, l := range ls {
		out[i] = l.path
	}
	return out
}
