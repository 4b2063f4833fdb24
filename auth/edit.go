package auth

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/gateway"
)

// Errors of Edit.
var (
	// ErrExists: Add of a device the file already lists.
	ErrExists = errors.New("already in the devices file")
	// ErrAbsent: Rotate or Remove of a device the file does not list.
	ErrAbsent = errors.New("not in the devices file")
	// ErrInvalid: the edit would leave a file that does not load (a bad
	// key or hash), or gives no secret.
	ErrInvalid = errors.New("invalid credentials")
)

// GeneratedPSKLen is the length of a key GeneratePSK makes, in bytes.
const GeneratedPSKLen = 32

// GeneratePSK returns a new random pre-shared key in the devices file's
// form ("hex:" and 64 hex digits).
func GeneratePSK() (string, error) {
	key := make([]byte, GeneratedPSKLen)
	if _, err := rand.Read(key); err != nil {
		return "", fmt.Errorf("generate a key: %w", err)
	}
	return "hex:" + hex.EncodeToString(key), nil
}

// Secrets are the credentials an edit gives a device, in the devices
// file's forms: PSK "hex:..", "base64:.." or "text:.."; PasswordHash a
// bcrypt hash (HashPassword); and its Lease, a duration ("2h",
// ParseLease), which is no secret but is written the same way, or
// NoLease, which removes the device's own lease (Rotate). An empty
// field is left as it is (Rotate) or absent (Add). A Rotate that gives
// only a Lease changes the lease and keeps the secrets.
type Secrets struct {
	PSK          string
	PasswordHash string
	Lease        string
}

// NoLease is Secrets.Lease removing a device's own lease: it then has
// presence.lease (or the lease it learns, presence.learn_lease).
const NoLease = "none"

// LeaseBounds bound the devices' leases as the configuration does
// (Devices.CheckLeases): presence.lease and presence.max_lease.
type LeaseBounds struct {
	Lease, MaxLease time.Duration
}

// Op is an edit of one device's entry.
type Op int

const (
	// Add appends a device the file does not list (ErrExists otherwise).
	Add Op = iota + 1
	// Rotate replaces the secrets given of a device the file lists
	// (ErrAbsent otherwise), keeping the others.
	Rotate
	// Remove deletes a device's entry (ErrAbsent when it has none).
	Remove
)

// Edit changes device's entry in the devices file at path: it reads the
// file, applies op with s (ignored by Remove) to its YAML (comments and
// the other entries stay), parses the result as Load does and checks its
// leases within b (an edit that would leave the file invalid is refused
// and the file is not touched),
// and replaces the file atomically: a temporary file in the same
// directory, written and synced, given the file's mode and owner, renamed
// over it, then the directory synced. A symbolic link is followed (its
// target is replaced). Concurrent edits of one file, from any process,
// are serialised by an exclusive lock on it (flock), taken again when the
// file was replaced while waiting. It returns the set the new file
// holds.
func Edit(path string, op Op, device gateway.DeviceID, s Secrets, b LeaseBounds) (*Devices, error) {
	real, err := filepath.EvalSymlinks(path)
	if err != nil {
		return nil, fmt.Errorf("devices file: %w", err)
	}
	f, err := lockFile(real)
	if err != nil {
		return nil, err
	}
	defer f.Close() // releases the lock
	data, err := os.ReadFile(real)
	if err != nil {
		return nil, fmt.Errorf("devices file: %w", err)
	}
	out, err := editYAML(path, data, op, device, s)
	if err != nil {
		return nil, err
	}
	d, err := Parse(path, out)
	if err == nil {
		err = d.CheckLeases(b.Lease, b.MaxLease)
	}
	if err != nil {
		return nil, fmt.Errorf("%w: the edited devices file would not load, left unchanged:\n%w", ErrInvalid, err)
	}
	if err := replaceFile(real, out); err != nil {
		return nil, fmt.Errorf("devices file %s: %w", path, err)
	}
	return d, nil
}

// lockFile opens path and holds an exclusive flock on it, on the file
// path names once the lock is held (a rename by the holder before us
// replaced the one we waited on).
func lockFile(path string) (*os.File, error) {
	for range 100 {
		f, err := os.Open(path)
		if err != nil {
			return nil, fmt.Errorf("devices file: %w", err)
		}
		if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX); err != nil {
			f.Close()
			return nil, fmt.Errorf("devices file: lock: %w", err)
		}
		held, err1 := f.Stat()
		now, err2 := os.Stat(path)
		if err := errors.Join(err1, err2); err != nil {
			f.Close()
			return nil, fmt.Errorf("devices file: %w", err)
		}
		if os.SameFile(held, now) {
			return f, nil
		}
		f.Close()
	}
	return nil, fmt.Errorf("devices file %s: replaced 100 times while waiting for its lock", path)
}

// replaceFile writes data to path atomically, keeping path's mode and
// owner.
func replaceFile(path string, data []byte) (err error) {
	st, err := os.Stat(path)
	if err != nil {
		return err
	}
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return err
	}
	if err := tmp.Chmod(st.Mode().Perm()); err != nil {
		return err
	}
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		if err := tmp.Chown(int(sys.Uid), int(sys.Gid)); err != nil {
			return fmt.Errorf("keep the owner %d:%d: %w (edit it as root or as its owner)", sys.Uid, sys.Gid, err)
		}
	}
	if err := tmp.Sync(); err != nil {
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return err
	}
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// editYAML applies op to the devices list of a devices file's contents
// (name is for errors). The file must parse: the edit starts from a valid
// file.
func editYAML(name string, data []byte, op Op, device gateway.DeviceID, s Secrets) ([]byte, error) {
	if _, err := Parse(name, data); err != nil {
		return nil, fmt.Errorf("the devices file does not load; fix it first:\n%w", err)
	}
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	list := devicesList(&doc)
	at := -1
	for i, item := range list.Content {
		if entryID(item) == string(device) {
			at = i
		}
	}
	switch {
	case op == Add && at >= 0:
		return nil, fmt.Errorf("device %s: %w", device, ErrExists)
	case op != Add && at < 0:
		return nil, fmt.Errorf("device %s: %w", device, ErrAbsent)
	case op == Add && s.PSK == "" && s.PasswordHash == "", op == Rotate && s == (Secrets{}):
		return nil, fmt.Errorf("device %s: %w: no psk and no password given", device, ErrInvalid)
	case op == Add && s.Lease == NoLease:
		return nil, fmt.Errorf("device %s: %w: lease %q: a new device has no lease of its own to remove", device, ErrInvalid, NoLease)
	}
	switch op {
	case Add:
		item := &yaml.Node{Kind: yaml.MappingNode}
		setField(item, "id", string(device))
		setSecrets(item, s)
		list.Content = append(list.Content, item)
	case Rotate:
		item := list.Content[at]
		if item.Kind == yaml.AliasNode {
			return nil, fmt.Errorf("device %s: its entry is a YAML alias; edit the file by hand", device)
		}
		setSecrets(item, s)
	case Remove:
		list.Content = append(list.Content[:at], list.Content[at+1:]...)
	default:
		return nil, fmt.Errorf("edit op %d", op)
	}
	list.Style = 0 // block style, also for "devices: []"
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// devicesList is the devices list node of a parsed (valid) file; a null
// list ("devices:" with every entry commented out) becomes an empty one.
func devicesList(doc *yaml.Node) *yaml.Node {
	root := doc.Content[0]
	for i := 0; i+1 < len(root.Content); i += 2 {
		if root.Content[i].Value == "devices" {
			v := root.Content[i+1]
			if v.Kind == yaml.AliasNode {
				v = v.Alias
			}
			if v.Kind != yaml.SequenceNode {
				*v = yaml.Node{Kind: yaml.SequenceNode, Tag: "!!seq", HeadComment: v.HeadComment, LineComment: v.LineComment, FootComment: v.FootComment}
			}
			return v
		}
	}
	panic("auth: a valid devices file without a devices list")
}

// entryID is the id of a devices list item ("" when it has none).
func entryID(item *yaml.Node) string {
	if item.Kind == yaml.AliasNode {
		item = item.Alias
	}
	for i := 0; i+1 < len(item.Content); i += 2 {
		if item.Content[i].Value == "id" {
			return item.Content[i+1].Value
		}
	}
	return ""
}

// setSecrets sets the secrets of s that are not empty in mapping item.
func setSecrets(item *yaml.Node, s Secrets) {
	if s.PSK != "" {
		setField(item, "psk", s.PSK)
	}
	if s.PasswordHash != "" {
		setField(item, "password_bcrypt", s.PasswordHash)
	}
	switch s.Lease {
	case "":
	case NoLease:
		deleteField(item, "lease")
	default:
		setField(item, "lease", s.Lease)
	}
}

// deleteField removes key from mapping m, if it is there.
func deleteField(m *yaml.Node, key string) {
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content = append(m.Content[:i], m.Content[i+2:]...)
			return
		}
	}
}

// setField sets key to the string value in mapping m, double-quoted.
func setField(m *yaml.Node, key, value string) {
	v := &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: value, Style: yaml.DoubleQuotedStyle}
	for i := 0; i+1 < len(m.Content); i += 2 {
		if m.Content[i].Value == key {
			m.Content[i+1] = v
			return
		}
	}
	m.Content = append(m.Content, &yaml.Node{Kind: yaml.ScalarNode, Tag: "!!str", Value: key}, v)
}
