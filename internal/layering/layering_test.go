// Package layering holds the test of the repository's import rules: the
// domain in gateway imports nothing of the module; the parts beside it
// (front ends, stores, queues, uplink, runner, admin, events, auth,
// configs, sim) meet only in gateway's types and internal helpers, never
// importing each other; cmd/fleetgate wires them; the adapter plugins,
// built as their own binaries, import only the plugin contract and SDK.
// Go refuses import cycles itself; these rules also refuse an import
// that runs upward or sideways.
package layering

import (
	"bufio"
	"bytes"
	"os/exec"
	"strings"
	"testing"
)

const module = "github.com/fleetgate/fleetgate"

// part is a package's top-level directory ("store", "protocols", ...),
// its unit of layering.
func part(pkg string) string {
	top, _, _ := strings.Cut(pkg, "/")
	return top
}

// collections are the top-level directories whose packages are
// alternatives of one kind (the stores, the front ends, the event
// outlets, the data path's queues), kept apart from each other.
var collections = map[string]bool{"store": true, "protocols": true, "events": true, "queue": true}

// allowed says whether pkg may import dep (both relative to the module),
// and why not when it may not.
func allowed(pkg, dep string) (bool, string) {
	switch from, to := part(pkg), part(dep); {
	case to == "cmd":
		return false, "nothing imports a command"
	case pkg == "gateway":
		return false, "gateway, the domain, imports no package of the module"
	case from == "plugins":
		return to == "plugins", "an adapter plugin is its own binary: it imports only plugins/proto and plugins/sdk"
	case from == "cmd":
		return true, ""
	case from == "internal":
		return to == "internal" || to == "gateway", "internal helpers import only gateway and other internal helpers"
	case from == "gateway":
		return to == "gateway", "gateway's helpers import only gateway"
	case from == to && collections[from]:
		return false, "the packages of " + from + "/ are alternatives beside each other: they do not import each other"
	case from == to:
		return true, ""
	default:
		ok := to == "gateway" || to == "internal" || dep == "plugins/proto"
		return ok, "the parts beside gateway import only gateway, internal helpers and plugins/proto, never each other"
	}
}

// TestImportsFollowTheLayers lists every package of the module with its
// imports (not its tests') and checks each import against allowed.
func TestImportsFollowTheLayers(t *testing.T) {
	cmd := exec.Command("go", "list", "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, module+"/...")
	cmd.Dir = "../.."
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	pkgs := 0
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		pkg, ok := strings.CutPrefix(fields[0], module+"/")
		if !ok {
			t.Fatalf("go list named %s, outside the module", fields[0])
		}
		pkgs++
		for _, imp := range fields[1:] {
			dep, ok := strings.CutPrefix(imp, module+"/")
			if !ok {
				continue
			}
			if ok, why := allowed(pkg, dep); !ok {
				t.Errorf("%s imports %s: %s", pkg, dep, why)
			}
		}
	}
	if pkgs < 20 {
		t.Fatalf("go list named %d packages of the module, want the whole tree:\n%s", pkgs, out)
	}
}

// TestAllowed pins the rules on examples, so that a change to allowed
// that lets a sideways import through fails here.
func TestAllowed(t *testing.T) {
	for _, c := range []struct {
		pkg, dep string
		ok       bool
	}{
		{"cmd/fleetgate", "store/redisstore", true},
		{"uplink", "gateway", true},
		{"uplink", "internal/statefile", true},
		{"uplink", "store/embedded", false},
		{"runner", "uplink", false},
		{"protocols/adapter", "plugins/proto", true},
		{"protocols/coap", "protocols/mqtt", false},
		{"store/embedded", "store/redisstore", false},
		{"queue/diskq", "queue/memq", false},
		{"queue/memq", "queue/queuetest", false},
		{"queue/queuetest", "gateway/clocktest", true},
		{"queue/diskq", "internal/statefile", true},
		{"protocols/coap", "auth", false},
		{"store/storetest", "gateway/clocktest", true},
		{"sim/naive", "sim", true},
		{"gateway", "internal/statefile", false},
		{"gateway/clocktest", "gateway", true},
		{"internal/statefile", "uplink", false},
		{"plugins/udpline", "plugins/sdk", true},
		{"plugins/udpline", "gateway", false},
		{"admin", "cmd/fleetgate", false},
	} {
		if ok, _ := allowed(c.pkg, c.dep); ok != c.ok {
			t.Errorf("allowed(%s, %s) = %v, want %v", c.pkg, c.dep, ok, c.ok)
		}
	}
}
