package auth

import (
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/fleetgate/fleetgate/gateway"
	"github.com/fleetgate/fleetgate/internal/yamlpos"
	"go.yaml.in/yaml/v3"
)

// entry is one device of the file, validated.
type entry struct {
	id   gateway.DeviceID
	psk  []byte
	hash []byte
	cost int
	// lease is the device's own lease (0: none), at is where the file
	// sets it ("name:line:column: devices[i].lease").
	lease time.Duration
	at    string
}

// decodeFile decodes the devices file, reporting every problem it finds
// (up to yamlpos.MaxErrors) with its position.
func decodeFile(name string, data []byte) ([]entry, error) {
	root, err := yamlpos.Document(name, data, "the devices file")
	if err != nil {
		return nil, err
	}
	if root == nil {
		return nil, fmt.Errorf("%s: the file is empty; want a devices list (write \"devices: []\" for none)", name)
	}
	d := &decoder{name: name, errs: yamlpos.NewErrors(name), seen: make(map[gateway.DeviceID]int)}
	entries := d.top(root)
	if err := d.errs.Err(); err != nil {
		return nil, err
	}
	return entries, nil
}

// decoder walks the yaml.Node tree so that every error carries the
// node's position and the key's path.
type decoder struct {
	name string
	errs *yamlpos.Errors
	seen map[gateway.DeviceID]int // device → line of its id
}

// top decodes the top-level mapping, which holds only the devices list.
func (d *decoder) top(n *yaml.Node) []entry {
	if n.Kind != yaml.MappingNode {
		d.errs.Add(n, "top level: want a mapping with a devices list, got %s", describe(n))
		return nil
	}
	var entries []entry
	found := false
	d.fields(n, "at the top level", []string{"devices"}, func(_ string, v *yaml.Node) {
		found = true
		entries = d.list(v)
	})
	if !found && d.errs.Len() == 0 {
		d.errs.Add(n, "top level: no devices list (write \"devices: []\" for none)")
	}
	return entries
}

// list decodes the devices list.
func (d *decoder) list(n *yaml.Node) []entry {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if isNull(n) {
		return nil // every entry commented out: no devices
	}
	if n.Kind != yaml.SequenceNode {
		d.errs.Add(n, "devices: want a list of devices, got %s", describe(n))
		return nil
	}
	entries := make([]entry, 0, len(n.Content))
	for i, item := range n.Content {
		if e, ok := d.device(item, fmt.Sprintf("devices[%d]", i)); ok {
			entries = append(entries, e)
		}
	}
	return entries
}

// fields calls set for each key of mapping n that is one of known,
// reporting other keys, duplicate keys and merge keys. where places the
// mapping in messages ("in devices[3]").
func (d *decoder) fields(n *yaml.Node, where string, known []string, set func(key string, v *yaml.Node)) {
	seen := make(map[string]int, len(n.Content)/2)
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		switch {
		case k.Kind != yaml.ScalarNode:
			d.errs.Add(k, "keys %s must be plain names, got %s", where, describe(k))
		case k.ShortTag() == "!!merge":
			d.errs.Add(k, "merge keys (<<) are not supported %s", where)
		case seen[k.Value] != 0:
			d.errs.Add(k, "key %q %s is already set at line %d", k.Value, where, seen[k.Value])
		default:
			seen[k.Value] = k.Line
			if !slices.Contains(known, k.Value) {
				d.errs.Add(k, "unknown key %q %s (want %s)", k.Value, where, strings.Join(known, ", "))
				continue
			}
			set(k.Value, v)
		}
	}
}

// device decodes and validates one list item at path ("devices[3]").
func (d *decoder) device(n *yaml.Node, path string) (entry, bool) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind != yaml.MappingNode {
		d.errs.Add(n, "%s: want a mapping with id, psk and password_bcrypt, got %s", path, describe(n))
		return entry{}, false
	}
	before := d.errs.Len()
	var e entry
	d.fields(n, "in "+path, []string{"id", "psk", "password_bcrypt", "lease"}, func(key string, v *yaml.Node) {
		if v.Kind == yaml.AliasNode {
			v = v.Alias
		}
		at := path + "." + key
		if v.Kind != yaml.ScalarNode || isNull(v) {
			d.errs.Add(v, "%s: want a string, got %s", at, describe(v))
			return
		}
		switch key {
		case "id":
			id, err := gateway.ParseDeviceID(v.Value)
			if err != nil {
				d.errs.Add(v, "%s: %v", at, err)
				return
			}
			if line, dup := d.seen[id]; dup {
				d.errs.Add(v, "%s: device %q is already listed at line %d", at, id, line)
				return
			}
			d.seen[id] = v.Line
			e.id = id
		case "psk":
			psk, err := parsePSK(v.Value)
			if err != nil {
				d.errs.Add(v, "%s: %v", at, err)
				return
			}
			e.psk = psk
		case "password_bcrypt":
			cost, err := parseHash(v.Value)
			if err != nil {
				d.errs.Add(v, "%s: %v", at, err)
				return
			}
			e.hash, e.cost = []byte(v.Value), cost
		case "lease":
			lease, err := ParseLease(v.Value)
			if err != nil {
				d.errs.Add(v, "%s: %v", at, err)
				return
			}
			e.lease, e.at = lease, fmt.Sprintf("%s:%d:%d: %s", d.name, v.Line, v.Column, at)
		}
	})
	if d.errs.Len() > before {
		return entry{}, false
	}
	switch {
	case e.id == "":
		d.errs.Add(n, "%s: no id", path)
		return entry{}, false
	case e.psk == nil && e.hash == nil:
		d.errs.Add(n, "%s: device %q has neither psk nor password_bcrypt", path, e.id)
		return entry{}, false
	}
	return e, true
}

// ParseLease parses a device's lease: a Go duration with its unit
// ("90s", "1h30m"), above zero. Bounded by presence.lease and
// presence.max_lease only where the configuration is known
// (Devices.CheckLeases).
func ParseLease(s string) (time.Duration, error) {
	d, err := time.ParseDuration(s)
	switch {
	case err != nil && strings.Trim(s, "0123456789") == "":
		return 0, fmt.Errorf("%q has no unit; write a duration such as 90s, 15m or 2h", s)
	case err != nil:
		return 0, fmt.Errorf("%q is not a duration such as 90s, 15m or 2h", s)
	case d <= 0:
		return 0, fmt.Errorf("%s must be above zero", d)
	}
	return d, nil
}

// parsePSK decodes "hex:..." or "base64:..." (standard alphabet, padded),
// or takes the bytes of "text:..." as they are (printable ASCII, no
// space: the form of clients that take the key as a string, such as
// libcoap's coap-client -k). Its errors never quote the key.
func parsePSK(s string) ([]byte, error) {
	var key []byte
	var err error
	switch enc, text, _ := strings.Cut(s, ":"); enc {
	case "hex":
		if key, err = hex.DecodeString(text); err != nil {
			return nil, errors.New("the key after \"hex:\" is not valid hexadecimal")
		}
	case "base64":
		if key, err = base64.StdEncoding.Strict().DecodeString(text); err != nil {
			return nil, errors.New("the key after \"base64:\" is not valid padded standard base64")
		}
	case "text":
		for i := 0; i < len(text); i++ {
			if text[i] < '!' || text[i] > '~' {
				return nil, fmt.Errorf("the key after \"text:\" has a byte that is not printable ASCII at %d (a space or a control byte)", i)
			}
		}
		key = []byte(text)
	default:
		return nil, errors.New("want \"hex:\", \"base64:\" or \"text:\" followed by the key")
	}
	if len(key) < MinPSKLen || len(key) > MaxPSKLen {
		return nil, fmt.Errorf("the key is %d bytes, want %d to %d", len(key), MinPSKLen, MaxPSKLen)
	}
	return key, nil
}

// bcryptRE is the modular crypt format of bcrypt: version, two-digit
// cost, then 22 characters of salt and 31 of hash in bcrypt's base64.
var bcryptRE = regexp.MustCompile(`^\$2[aby]\$([0-9]{2})\$[./A-Za-z0-9]{53}$`)

// parseHash checks that s is a bcrypt hash and returns its cost.
func parseHash(s string) (int, error) {
	m := bcryptRE.FindStringSubmatch(s)
	if m == nil {
		return 0, errors.New("not a bcrypt hash (\"$2a$\", \"$2b$\" or \"$2y$\", a two-digit cost, \"$\" and 53 characters of ./A-Za-z0-9); make one with \"fleetgate hash-password\"")
	}
	cost, _ := strconv.Atoi(m[1])
	if cost < MinCost || cost > MaxCost {
		return 0, fmt.Errorf("bcrypt cost %d is not in %d..%d", cost, MinCost, MaxCost)
	}
	return cost, nil
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.ShortTag() == "!!null"
}

// describe names what a node holds for "want X, got Y" messages, without
// its value (which may be a secret).
func describe(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.AliasNode:
		return "an alias"
	case yaml.ScalarNode:
		switch n.ShortTag() {
		case "!!null":
			return "no value"
		case "!!int", "!!float":
			return "a number"
		case "!!bool":
			return "true or false"
		}
		return "a string"
	}
	return "a document"
}
