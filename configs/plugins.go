package configs

import (
	"encoding/hex"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/gateway"
)

// Adapter defaults and limits checked by validation.
const (
	DefaultAdapterStartTimeout = 10 * time.Second
	MaxAdapterStartTimeout     = 5 * time.Minute
	// MaxAdapterNameLen keeps "<name>/<instance>" session IDs short.
	MaxAdapterNameLen = 64
	// Default limits of an adapter.
	DefaultAdapterMaxSessions       = 2000
	DefaultAdapterMaxDevices        = 1000
	DefaultAdapterEvidencePerSecond = 200
	// DefaultAdapterDataBytesPerSecond bounds an adapter's device data
	// (the messages' sizes, gateway.Message.Size).
	DefaultAdapterDataBytesPerSecond = 1 << 20
	// Bounds of an adapter's OS limits (when set).
	MinAdapterAddressSpace = 64 << 20
	MinAdapterOpenFiles    = 32
	MaxAdapterOpenFiles    = 1 << 20
)

// reservedAdapterNames are the front ends' names: their sessions are
// "coap/<instance>" and their evidence is counted under them, so an
// adapter of that name could end or renew their sessions.
var reservedAdapterNames = []string{"coap", "mqtt"}

// PluginsConfig lists the adapter plugins to start.
type PluginsConfig struct {
	// Dir holds adapter executables named by a relative path.
	Dir string `yaml:"dir"`
	// Adapters are the adapters to run; SIGHUP applies a changed list.
	Adapters []AdapterConfig `yaml:"adapters"`
}

// AdapterConfig is one entry of plugins.adapters. In the file a bare
// name ("- udpline") stands for {name: udpline}.
type AdapterConfig struct {
	// Name names the adapter's sessions ("<name>/<instance>"), log lines,
	// metrics and status: the device-ID alphabet, at most 64 bytes.
	Name string `yaml:"name"`
	// Path is the executable: absolute, or relative to plugins.dir; empty
	// means Name in plugins.dir.
	Path string `yaml:"path"`
	// SHA256 is the executable's expected checksum (64 hex digits),
	// checked on the file that is then executed; empty checks no sum.
	SHA256 string `yaml:"sha256"`
	// Devices are the device IDs the adapter may speak for: exact IDs and
	// prefixes ("lw-*"; "*": every ID); default "<name>-*". A device of
	// the devices file is never an adapter's.
	Devices []string `yaml:"devices"`
	// StartTimeout bounds the handshake, Configure and the first frame.
	StartTimeout Duration `yaml:"start_timeout"`
	// Lease is the lease of the adapter's evidence that carries none of
	// its own (the SDK's Evidence.Lease); 0: presence.lease (or the
	// learned one). Else within [presence.lease, presence.max_lease].
	Lease  Duration      `yaml:"lease"`
	Limits AdapterLimits `yaml:"limits"`
	// Config is the adapter's own settings, passed to its Configure as
	// JSON.
	Config AdapterSettings `yaml:"config"`
}

// AdapterLimits bound what one adapter can make the gateway spend (0 is
// unlimited), and the OS limits of its process (0 leaves what it
// inherits).
type AdapterLimits struct {
	MaxSessions       int `yaml:"max_sessions"`
	MaxDevices        int `yaml:"max_devices"`
	EvidencePerSecond int `yaml:"evidence_per_second"`
	// DataBytesPerSecond bounds the bytes of device data taken per second
	// (burst as many); beyond it data is dropped while its evidence
	// counts. 0: unlimited.
	DataBytesPerSecond int `yaml:"data_bytes_per_second"`
	// MaxAddressSpace is RLIMIT_AS in bytes.
	MaxAddressSpace int64 `yaml:"max_address_space"`
	// MaxOpenFiles is RLIMIT_NOFILE.
	MaxOpenFiles int `yaml:"max_open_files"`
}

// AdapterSettings is an adapter's `config` subtree, kept as JSON (keys
// sorted), "" when none is given.
type AdapterSettings string

// MarshalYAML renders the settings as the mapping they came from.
func (s AdapterSettings) MarshalYAML() (any, error) {
	if s == "" {
		return map[string]any{}, nil
	}
	var v any
	if err := json.Unmarshal([]byte(s), &v); err != nil {
		return nil, fmt.Errorf("adapter config: %w", err)
	}
	return v, nil
}

// JSON returns the settings for Configure ("{}" when none).
func (s AdapterSettings) JSON() []byte {
	if s == "" {
		return []byte("{}")
	}
	return []byte(s)
}

// DefaultAdapter returns the entry for name with every default.
func DefaultAdapter(name string) AdapterConfig {
	return AdapterConfig{
		Name: name, Devices: DefaultAdapterDevices(name), StartTimeout: Duration(DefaultAdapterStartTimeout),
		Limits: AdapterLimits{
			MaxSessions: DefaultAdapterMaxSessions, MaxDevices: DefaultAdapterMaxDevices,
			EvidencePerSecond:  DefaultAdapterEvidencePerSecond,
			DataBytesPerSecond: DefaultAdapterDataBytesPerSecond,
		},
	}
}

// DefaultAdapterDevices is the devices of an adapter named name that
// names none: the IDs that start with "<name>-".
func DefaultAdapterDevices(name string) []string { return []string{name + "-*"} }

// AdapterPath resolves a's executable against dir.
func (p PluginsConfig) AdapterPath(a AdapterConfig) string {
	path := a.Path
	if path == "" {
		path = a.Name
	}
	if filepath.IsAbs(path) {
		return filepath.Clean(path)
	}
	return filepath.Join(p.Dir, path)
}

var (
	adapterListType = reflect.TypeFor[[]AdapterConfig]()
	settingsType    = reflect.TypeFor[AdapterSettings]()
)

// adapterList decodes plugins.adapters: each entry a mapping (or a bare
// name) over DefaultAdapter, checked at once so that a problem carries
// its line.
func (d *decoder) adapterList(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		v.Set(reflect.ValueOf([]AdapterConfig{}))
		return
	}
	if n.Kind != yaml.SequenceNode {
		d.errs.Add(n, "%s: want a list of adapters, got %s", path, describe(n))
		return
	}
	list := make([]AdapterConfig, 0, len(n.Content))
	seen := make(map[string]int)
	for i, e := range n.Content {
		if e.Kind == yaml.AliasNode {
			e = e.Alias
		}
		key := fmt.Sprintf("%s[%d]", path, i)
		var a AdapterConfig
		switch {
		case e.Kind == yaml.ScalarNode && e.ShortTag() == "!!str":
			a = DefaultAdapter(e.Value)
		case e.Kind == yaml.MappingNode:
			a = DefaultAdapter("")
			a.Devices = nil
			before := d.errs.Len()
			d.mapping(e, key, reflect.ValueOf(&a).Elem())
			if d.errs.Len() > before {
				continue
			}
			if a.Devices == nil {
				a.Devices = DefaultAdapterDevices(a.Name)
			}
		default:
			d.errs.Add(e, "%s: want an adapter (a mapping with name, or a bare name), got %s", key, describe(e))
			continue
		}
		for _, problem := range a.problems() {
			d.errs.Add(e, "%s: %s", key, problem)
		}
		if line, dup := seen[a.Name]; dup && a.Name != "" {
			d.errs.Add(e, "%s: adapter name %q is already used at line %d", key, a.Name, line)
		}
		for _, problem := range overlaps(list, a) {
			d.errs.Add(e, "%s: %s (line %d)", key, problem.text, seen[problem.other])
		}
		seen[a.Name] = e.Line
		list = append(list, a)
	}
	v.Set(reflect.ValueOf(list))
}

// settings decodes an adapter's config subtree into JSON.
func (d *decoder) settings(n *yaml.Node, path string, v reflect.Value) {
	if n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null" {
		v.SetString("")
		return
	}
	if n.Kind != yaml.MappingNode {
		d.errs.Add(n, "%s: want a mapping of the adapter's settings, got %s", path, describe(n))
		return
	}
	before := d.errs.Len()
	d.settingFiles(n, path)
	if d.errs.Len() > before {
		return
	}
	var val any
	if err := n.Decode(&val); err != nil {
		d.errs.Add(n, "%s: %v", path, err)
		return
	}
	b, err := json.Marshal(val)
	if err != nil {
		d.errs.Add(n, "%s: cannot pass it to the adapter as JSON (keys must be strings): %v", path, err)
		return
	}
	if string(b) == "{}" {
		b = nil // no settings
	}
	v.SetString(string(b))
}

// problems checks one adapter entry on its own.
func (a AdapterConfig) problems() []string {
	var out []string
	if a.Name == "" {
		out = append(out, "name: must be set")
	} else if _, err := gateway.ParseDeviceID(a.Name); err != nil || len(a.Name) > MaxAdapterNameLen {
		out = append(out, fmt.Sprintf("name: %q must be 1 to %d of A-Z a-z 0-9 . _ : - (it names sessions \"<name>/<instance>\")", a.Name, MaxAdapterNameLen))
	}
	for _, r := range reservedAdapterNames {
		if strings.EqualFold(a.Name, r) {
			out = append(out, fmt.Sprintf("name: %q is the %s front end's: its sessions would be %s's sessions", a.Name, r, r))
		}
	}
	out = append(out, devicesProblems(a.Devices)...)
	if a.SHA256 != "" {
		if b, err := hex.DecodeString(a.SHA256); err != nil || len(b) != 32 {
			out = append(out, fmt.Sprintf("sha256: %q is not 64 hex digits", a.SHA256))
		}
	}
	if a.StartTimeout <= 0 || a.StartTimeout.Std() > MaxAdapterStartTimeout {
		out = append(out, fmt.Sprintf("start_timeout: must be > 0 and <= %s, got %s", Duration(MaxAdapterStartTimeout), a.StartTimeout))
	}
	if a.Limits.MaxSessions < 0 {
		out = append(out, fmt.Sprintf("limits.max_sessions: must be >= 0 (0: unlimited), got %d", a.Limits.MaxSessions))
	}
	if a.Limits.MaxDevices < 0 {
		out = append(out, fmt.Sprintf("limits.max_devices: must be >= 0 (0: unlimited), got %d", a.Limits.MaxDevices))
	}
	if a.Limits.DataBytesPerSecond < 0 {
		out = append(out, fmt.Sprintf("limits.data_bytes_per_second: must be >= 0 (0: unlimited), got %d", a.Limits.DataBytesPerSecond))
	}
	if a.Limits.EvidencePerSecond < 0 {
		out = append(out, fmt.Sprintf("limits.evidence_per_second: must be >= 0 (0: unlimited), got %d", a.Limits.EvidencePerSecond))
	}
	if v := a.Limits.MaxAddressSpace; v != 0 && v < MinAdapterAddressSpace {
		out = append(out, fmt.Sprintf("limits.max_address_space: must be 0 (not set) or at least %d bytes (64 MiB; a Go adapter reserves about 2 GiB), got %d", MinAdapterAddressSpace, v))
	}
	if v := a.Limits.MaxOpenFiles; v != 0 && (v < MinAdapterOpenFiles || v > MaxAdapterOpenFiles) {
		out = append(out, fmt.Sprintf("limits.max_open_files: must be 0 (not set) or %d to %d, got %d", MinAdapterOpenFiles, MaxAdapterOpenFiles, v))
	}
	if a.Config != "" && !json.Valid([]byte(a.Config)) {
		out = append(out, "config: not valid JSON")
	}
	return out
}

func (c Config) validatePlugins(p *problems) {
	if len(c.Plugins.Adapters) == 0 {
		return
	}
	if c.Plugins.Dir == "" {
		for _, a := range c.Plugins.Adapters {
			if !filepath.IsAbs(a.Path) {
				p.add("plugins.dir", "must be set when an adapter's path is not absolute")
				break
			}
		}
	}
	seen := make(map[string]int, len(c.Plugins.Adapters))
	for i, a := range c.Plugins.Adapters {
		key := fmt.Sprintf("plugins.adapters[%d]", i)
		for _, problem := range a.problems() {
			p.add(key, "%s", problem)
		}
		if _, dup := seen[a.Name]; dup {
			p.add(key, "adapter name %q is listed twice", a.Name)
		}
		for _, o := range overlaps(c.Plugins.Adapters[:i], a) {
			p.add(key, "%s (plugins.adapters[%d])", o.text, seen[o.other])
		}
		if a.Name == c.Gateway.ID {
			p.add(key, "name: %q is gateway.id: its sessions \"%s/<instance>\" would be the MQTT front end's (\"%s/mqtt\")", a.Name, a.Name, a.Name)
		}
		if why := c.leaseProblem(a.Lease); why != "" {
			p.addAt(key+".lease", "%s", why)
		}
		seen[a.Name] = i
	}
}

// devicesProblems checks an adapter's devices entries.
func devicesProblems(devices []string) []string {
	if len(devices) == 0 {
		return []string{`devices: must name at least one device ID or prefix ("*": every device not in the devices file)`}
	}
	var out []string
	for i, d := range devices {
		id, prefix := strings.CutSuffix(d, "*")
		if prefix && id == "" {
			continue
		}
		if _, err := gateway.ParseDeviceID(id); err != nil {
			out = append(out, fmt.Sprintf(`devices[%d]: %q must be a device ID, a device ID prefix followed by "*", or "*"`, i, d))
		}
	}
	return out
}

// adapterOverlap is a device two adapters could both speak for.
type adapterOverlap struct {
	text  string
	other string // the other adapter's name
}

// overlaps lists the devices entries of a that cover a device an adapter
// of before covers too: no two adapters speak for one device.
func overlaps(before []AdapterConfig, a AdapterConfig) []adapterOverlap {
	var out []adapterOverlap
	for _, b := range before {
		if b.Name == a.Name {
			continue // a duplicate name, refused as such
		}
		for _, x := range a.Devices {
			for _, y := range b.Devices {
				if entriesOverlap(x, y) {
					out = append(out, adapterOverlap{
						text:  fmt.Sprintf("devices: %q overlaps %q of adapter %q: no two adapters may speak for one device", x, y, b.Name),
						other: b.Name,
					})
				}
			}
		}
	}
	return out
}

// entriesOverlap reports whether two devices entries (an ID, or a prefix
// followed by "*") match a common device ID.
func entriesOverlap(x, y string) bool {
	xp, xPrefix := strings.CutSuffix(x, "*")
	yp, yPrefix := strings.CutSuffix(y, "*")
	switch {
	case xPrefix && yPrefix:
		return strings.HasPrefix(xp, yp) || strings.HasPrefix(yp, xp)
	case xPrefix:
		return strings.HasPrefix(y, xp)
	case yPrefix:
		return strings.HasPrefix(x, yp)
	}
	return x == y
}

// adapterNames parses FLEETGATE_PLUGINS_ADAPTERS: comma-separated names,
// each with every default.
func adapterNames(s string) []AdapterConfig {
	list := []AdapterConfig{}
	if s == "" {
		return list
	}
	for _, n := range strings.Split(s, ",") {
		list = append(list, DefaultAdapter(strings.TrimSpace(n)))
	}
	return list
}

// secretKey reports whether a settings key names a secret.
func secretKey(k string) bool {
	k = strings.ToLower(k)
	for _, s := range []string{"secret", "password", "passwd", "token", "api_key", "apikey", "psk"} {
		if strings.Contains(k, s) {
			return true
		}
	}
	return false
}

// redact replaces the values of secret-looking keys in the settings.
func (s AdapterSettings) redact() AdapterSettings {
	if s == "" {
		return s
	}
	var v any
	if json.Unmarshal([]byte(s), &v) != nil {
		return s
	}
	var walk func(any) any
	walk = func(x any) any {
		switch t := x.(type) {
		case map[string]any:
			for k, e := range t {
				if secretKey(k) && e != nil && e != "" {
					t[k] = "<redacted>"
				} else {
					t[k] = walk(e)
				}
			}
		case []any:
			for i := range t {
				t[i] = walk(t[i])
			}
		}
		return x
	}
	b, err := json.Marshal(walk(v))
	if err != nil {
		return s
	}
	return AdapterSettings(b)
}

// redactAdapters returns a copy of the list with secret settings
// redacted.
func redactAdapters(list []AdapterConfig) []AdapterConfig {
	if list == nil {
		return nil
	}
	out := make([]AdapterConfig, len(list))
	for i, a := range list {
		a.Config = a.Config.redact()
		out[i] = a
	}
	return out
}
