package configs_test

import (
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/fleetgate/fleetgate/configs"
)

// secretName matches a key whose name says it may hold a secret.
var secretName = regexp.MustCompile(`password|token|key|secret|psk`)

// holdsNoSecret names the keys whose name matches secretName but whose
// value is not a secret, with the reason. A key matching secretName that
// is neither here, nor a secret of configs.SecretKeys, nor a file name
// (_file), fails TestEverySecretIsRedacted: a new secret must be added to
// configs.SecretKeys (redacted, with its _file) or here.
var holdsNoSecret = map[string]string{
	"store.redis.key_prefix": "the prefix of Redis key names",
	"events.mqtt.tls.key":    "the name of a PEM file",
	"bridge.mqtt.tls.key":    "the name of a PEM file",
}

func TestEverySecretIsRedacted(t *testing.T) {
	keys := configs.Keys()
	secrets := configs.SecretKeys()
	if len(secrets) == 0 {
		t.Fatal("no secret keys")
	}
	for _, k := range keys {
		switch {
		case !secretName.MatchString(k), slices.Contains(secrets, k), holdsNoSecret[k] != "":
		case strings.HasSuffix(k, configs.FileSuffix):
			// the name of a file holding the secret
		default:
			t.Errorf("%s: its name says it may hold a secret, but it is neither in configs.SecretKeys (redacted, with %s%s) nor in holdsNoSecret", k, k, configs.FileSuffix)
		}
	}
	for k := range holdsNoSecret {
		if !slices.Contains(keys, k) {
			t.Errorf("holdsNoSecret names %s, which is no key", k)
		}
	}
	// every secret set, each to a value of its own: none is rendered
	var env []string
	for i, k := range secrets {
		if !slices.Contains(keys, k+configs.FileSuffix) {
			t.Errorf("secret %s has no key %s%s", k, k, configs.FileSuffix)
		}
		env = append(env, fmt.Sprintf("%s=value-%d-of-%s", configs.EnvName(k), i, k))
	}
	c, err := configs.Parse("x.yaml", nil, env)
	if err != nil {
		t.Fatal(err)
	}
	out, err := c.Redacted().YAML()
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range secrets {
		if v := fmt.Sprintf("value-%d-of-%s", i, k); strings.Contains(string(out), v) {
			t.Errorf("Redacted().YAML() shows %s (%s):\n%s", v, k, out)
		}
	}
	if n := strings.Count(string(out), "<redacted>"); n != len(secrets) {
		t.Errorf("%d values redacted, want %d:\n%s", n, len(secrets), out)
	}
	plain, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(plain), "value-0-of-") {
		t.Errorf("YAML() without Redacted lost the secrets:\n%s", plain)
	}
}

func writeFile(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// A secret's _file is read by Parse, so by Load at start and at every
// reload; the rendered configuration names the file, not the secret.
func TestSecretFiles(t *testing.T) {
	dir := t.TempDir()
	redisPW := writeFile(t, dir, "redis.pw", "redis-from-file\n")
	mqttPW := writeFile(t, dir, "mqtt.pw", "mqtt: from #file\r\n")
	cfg := writeFile(t, dir, "c.yaml", fmt.Sprintf("store:\n  redis:\n    password_file: %q\n", redisPW))
	env := []string{"FLEETGATE_EVENTS_MQTT_PASSWORD_FILE=" + mqttPW}
	c, err := configs.Load(cfg, env)
	if err != nil {
		t.Fatal(err)
	}
	if c.Store.Redis.Password != "redis-from-file" || c.Events.MQTT.Password != "mqtt: from #file" {
		t.Fatalf("passwords %q and %q", c.Store.Redis.Password, c.Events.MQTT.Password)
	}
	out, err := c.Redacted().YAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "from-file") || strings.Contains(string(out), "from #file") ||
		!strings.Contains(string(out), "password_file: "+redisPW) || !strings.Contains(string(out), "password_file: "+mqttPW) {
		t.Fatalf("rendered:\n%s", out)
	}
	// the rendering parses back to the same configuration
	plain, err := c.YAML()
	if err != nil {
		t.Fatal(err)
	}
	back, err := configs.Parse("out.yaml", plain, nil)
	if err != nil {
		t.Fatalf("%v\n%s", err, plain)
	}
	if !reflect.DeepEqual(back, c) {
		t.Fatalf("round trip gave\n%+v\nwant\n%+v", back, c)
	}
	// a reload reads the file again
	if err := os.WriteFile(redisPW, []byte("rotated\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if c, err = configs.Load(cfg, env); err != nil || c.Store.Redis.Password != "rotated" {
		t.Fatalf("after rotation: %q, %v", c.Store.Redis.Password, err)
	}
	if err := os.Remove(redisPW); err != nil {
		t.Fatal(err)
	}
	want := cfg + ":3:20: store.redis.password_file: stat " + redisPW + ": no such file or directory"
	if _, err := configs.Load(cfg, env); err == nil || err.Error() != want {
		t.Fatalf("Load with the file gone: %v\nwant %s", err, want)
	}
}

func TestSecretFileErrors(t *testing.T) {
	dir := t.TempDir()
	good := writeFile(t, dir, "good", "pw\n")
	empty := writeFile(t, dir, "empty", "\n")
	big := writeFile(t, dir, "big", strings.Repeat("x", configs.MaxSecretFileSize+1))
	for _, tc := range []struct {
		name, yaml string
		env        []string
		want       string
	}{
		{"both in the file", fmt.Sprintf("events:\n  mqtt:\n    password: pw\n    password_file: %q\n", good), nil,
			"x.yaml:4:20: events.mqtt.password_file: events.mqtt.password is set too; set one of them"},
		{"value from the environment", fmt.Sprintf("store: { redis: { password_file: %q } }\n", good), []string{"FLEETGATE_STORE_REDIS_PASSWORD=pw"},
			"x.yaml:1:34: store.redis.password_file: store.redis.password is set too; set one of them"},
		{"file from the environment", "store: { redis: { password: pw } }\n", []string{"FLEETGATE_STORE_REDIS_PASSWORD_FILE=" + good},
			"environment FLEETGATE_STORE_REDIS_PASSWORD_FILE (store.redis.password_file): store.redis.password is set too; set one of them"},
		{"empty", fmt.Sprintf("events: { mqtt: { password_file: %q } }\n", empty), nil,
			"x.yaml:1:34: events.mqtt.password_file: " + empty + " is empty"},
		{"too big", fmt.Sprintf("events: { mqtt: { password_file: %q } }\n", big), nil,
			fmt.Sprintf("x.yaml:1:34: events.mqtt.password_file: %s holds more than %d bytes; want the secret alone", big, configs.MaxSecretFileSize)},
		{"a directory", fmt.Sprintf("events: { mqtt: { password_file: %q } }\n", dir), nil,
			"x.yaml:1:34: events.mqtt.password_file: " + dir + " is not a regular file"},
		{"two problems", "events: { mqtt: { password_file: /nonexistent/a } }\n", []string{"FLEETGATE_STORE_REDIS_PASSWORD_FILE=/nonexistent/b"},
			"x.yaml:1:34: events.mqtt.password_file: stat /nonexistent/a: no such file or directory\n" +
				"environment FLEETGATE_STORE_REDIS_PASSWORD_FILE (store.redis.password_file): stat /nonexistent/b: no such file or directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := configs.Parse("x.yaml", []byte(tc.yaml), tc.env)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error:\n%v\nwant:\n%s", err, tc.want)
			}
		})
	}
}

// In an adapter's settings, <k>_file of a secret-looking <k> becomes <k>
// with the file's contents: the adapter gets the secret, check-config
// shows it redacted.
func TestAdapterSecretFiles(t *testing.T) {
	dir := t.TempDir()
	secret := writeFile(t, dir, "lora.secret", "lora-from-file\n")
	yml := fmt.Sprintf("plugins:\n  adapters:\n    - name: lora\n      config:\n        listen: 127.0.0.1:8080\n        secret_file: %q\n        nested: [{ api_token_file: %q }]\n        cert_file: /etc/x.pem\n", secret, secret)
	c, err := configs.Parse("x.yaml", []byte(yml), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"cert_file":"/etc/x.pem","listen":"127.0.0.1:8080","nested":[{"api_token":"lora-from-file"}],"secret":"lora-from-file"}`
	if got := string(c.Plugins.Adapters[0].Config.JSON()); got != want {
		t.Fatalf("settings %s\nwant %s", got, want)
	}
	out, err := c.Redacted().YAML()
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "lora-from-file") {
		t.Fatalf("rendered:\n%s", out)
	}
	for _, tc := range []struct{ name, settings, want string }{
		{"both", fmt.Sprintf("{ secret: x, secret_file: %q }", secret),
			"x.yaml:1:58: plugins.adapters[0].config.secret_file: plugins.adapters[0].config.secret is set too; set one of them"},
		{"missing", "{ token_file: /nonexistent }",
			"x.yaml:1:59: plugins.adapters[0].config.token_file: stat /nonexistent: no such file or directory"},
		{"not a name", "{ password_file: [a] }",
			"x.yaml:1:62: plugins.adapters[0].config.password_file: want the name of the file holding password, got a list"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := configs.Parse("x.yaml", []byte("plugins: { adapters: [{ name: lora, config: "+tc.settings+" }] }\n"), nil)
			if err == nil || err.Error() != tc.want {
				t.Fatalf("error:\n%v\nwant:\n%s", err, tc.want)
			}
		})
	}
}
