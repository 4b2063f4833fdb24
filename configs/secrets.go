package configs

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/fleetgate/fleetgate/internal/yamlpos"
)

// secretKeys lists every configuration key whose value is a secret. Each
// has a companion key, the same path with FileSuffix, that names a file
// holding the secret instead; Parse reads it (so at start and at every
// reload). Redacted hides their values. A test walks every key whose
// name says password, token, key, secret or psk, and fails on one that is
// neither listed here nor known to hold no secret.
var secretKeys = []string{
	"store.redis.password",
	"events.mqtt.password",
	"bridge.mqtt.password",
}

// FileSuffix turns a secret's key into the key of the file holding it
// (events.mqtt.password_file); in an adapter's settings it does the same
// for every key whose name says a secret (secretKey).
const FileSuffix = "_file"

// MaxSecretFileSize bounds a secret file: a secret is short, and a larger
// file is a mistake (a wrong name, /dev/zero behind a link).
const MaxSecretFileSize = 64 << 10

// redactedValue replaces a set secret in what Redacted returns.
const redactedValue = "<redacted>"

// SecretKeys returns the keys whose values are secrets.
func SecretKeys() []string { return slices.Clone(secretKeys) }

// secretField returns the field of c at the key path.
func secretField(c *Config, path string) reflect.Value {
	for _, l := range leaves() {
		if l.path == path {
			return reflect.ValueOf(c).Elem().FieldByIndex(l.index)
		}
	}
	panic("configs: no key " + path)
}

// redactSecrets replaces every set secret of c by "<redacted>".
func redactSecrets(c *Config) {
	for _, key := range secretKeys {
		if v := secretField(c, key); v.String() != "" {
			v.SetString(redactedValue)
		}
	}
}

// clearFileSecrets empties every secret of c that was read from its file,
// so that c renders as it is written: the file's name, not its contents.
func clearFileSecrets(c *Config) {
	for _, key := range secretKeys {
		if secretField(c, key+FileSuffix).String() != "" {
			secretField(c, key).SetString("")
		}
	}
}

// readSecretFiles sets every secret of c whose file key is set to the
// file's contents. A secret set together with its file, and a file that
// cannot be read, is an error naming the file key: at its line and
// column in data (the file called name), or naming the variable when the
// environment set it.
func readSecretFiles(name string, data []byte, env []string, c *Config) error {
	var (
		root    *yaml.Node
		inFile  = yamlpos.NewErrors(name)
		fromEnv []error
	)
	for _, key := range secretKeys {
		fileKey := key + FileSuffix
		path := secretField(c, fileKey).String()
		if path == "" {
			continue
		}
		problem := fmt.Sprintf("%s is set too; set one of them", key)
		if secretField(c, key).String() == "" {
			secret, err := readSecretFile(path)
			if err == nil {
				secretField(c, key).SetString(secret)
				continue
			}
			problem = err.Error()
		}
		if variable := EnvName(fileKey); slices.ContainsFunc(env, func(kv string) bool { return strings.HasPrefix(kv, variable+"=") }) {
			fromEnv = append(fromEnv, fmt.Errorf("environment %s (%s): %s", variable, fileKey, problem))
			continue
		}
		if root == nil {
			root, _ = yamlpos.Document(name, data, "the configuration") // decoded before: no error
		}
		inFile.Add(nodeAt(root, fileKey), "%s: %s", fileKey, problem)
	}
	return errors.Join(append([]error{inFile.Err()}, fromEnv...)...)
}

// nodeAt returns the value node of the key at path in the mapping root.
func nodeAt(root *yaml.Node, path string) *yaml.Node {
	n := root
	for _, name := range strings.Split(path, ".") {
		if n.Kind == yaml.AliasNode {
			n = n.Alias
		}
		next := n
		for i := 0; i+1 < len(n.Content); i += 2 {
			if n.Content[i].Value == name {
				next = n.Content[i+1]
			}
		}
		n = next
	}
	return n
}

// readSecretFile returns the contents of the regular file at path
// without its trailing line break.
func readSecretFile(path string) (string, error) {
	st, err := os.Stat(path)
	if err != nil {
		return "", err
	}
	if !st.Mode().IsRegular() {
		return "", fmt.Errorf("%s is not a regular file", path)
	}
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, MaxSecretFileSize+1))
	switch {
	case err != nil:
		return "", fmt.Errorf("read %s: %w", path, err)
	case len(b) > MaxSecretFileSize:
		return "", fmt.Errorf("%s holds more than %d bytes; want the secret alone", path, MaxSecretFileSize)
	}
	secret := strings.TrimRight(string(b), "\r\n")
	if secret == "" {
		return "", fmt.Errorf("%s is empty", path)
	}
	return secret, nil
}

// settingFiles replaces, in an adapter's settings n (at path), every key
// <k>_file whose <k> names a secret by <k> holding the file's contents,
// so that the adapter gets the secret itself. <k> and <k>_file together,
// and a file that cannot be read, are errors at their line.
func (d *decoder) settingFiles(n *yaml.Node, path string) {
	if n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.SequenceNode:
		for i, e := range n.Content {
			d.settingFiles(e, fmt.Sprintf("%s[%d]", path, i))
		}
	case yaml.MappingNode:
		keys := make(map[string]bool, len(n.Content)/2)
		for i := 0; i < len(n.Content); i += 2 {
			keys[n.Content[i].Value] = true
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			k, v := n.Content[i], n.Content[i+1]
			base, isFile := strings.CutSuffix(k.Value, FileSuffix)
			if !isFile || !secretKey(base) {
				d.settingFiles(v, join(path, k.Value))
				continue
			}
			key := join(path, k.Value)
			if keys[base] {
				d.errs.Add(k, "%s: %s is set too; set one of them", key, join(path, base))
				continue
			}
			if v.Kind != yaml.ScalarNode || v.ShortTag() != "!!str" {
				d.errs.Add(v, "%s: want the name of the file holding %s, got %s", key, base, describe(v))
				continue
			}
			secret, err := readSecretFile(v.Value)
			if err != nil {
				d.errs.Add(v, "%s: %v", key, err)
				continue
			}
			k.Value = base
			v.Value, v.Tag, v.Style = secret, "!!str", yaml.DoubleQuotedStyle
		}
	}
}
