package main

import (
	"os"
	"reflect"
	"strings"
	"testing"
)

func evalString(t *testing.T, src string, given map[string]string) (*recipe, error) {
	t.Helper()
	ins, err := parseFile("Containerfile", []byte(src))
	if err != nil {
		return nil, err
	}
	return evaluate("Containerfile", ins, given, platformArgs("linux", "arm", "v7"))
}

// The shipped Containerfile evaluates for each platform of `make image`,
// with the settings docs/operations.md promises.
func TestShippedContainerfile(t *testing.T) {
	src, err := os.ReadFile("../../container/Containerfile")
	if err != nil {
		t.Fatal(err)
	}
	ins, err := parseFile("container/Containerfile", src)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range [][3]string{{"linux", "amd64", ""}, {"linux", "arm64", ""}, {"linux", "arm", "v7"}} {
		r, err := evaluate("container/Containerfile", ins, map[string]string{"VERSION": "1.2.3", "REVISION": "abc", "CREATED": "2026-01-01T00:00:00Z"}, platformArgs(p[0], p[1], p[2]))
		if err != nil {
			t.Fatal(err)
		}
		c := r.config
		if c.User != "65532:65532" || c.WorkingDir != "/var/lib/fleetgate" ||
			!reflect.DeepEqual(c.Entrypoint, []string{"/usr/bin/fleetgate"}) ||
			!reflect.DeepEqual(c.Cmd, []string{"run", "-c", "/etc/fleetgate/fleetgate.yaml"}) {
			t.Errorf("%v: config %+v", p, c)
		}
		if _, ok := c.Volumes["/var/lib/fleetgate"]; !ok || len(c.Volumes) != 1 {
			t.Errorf("%v: volumes %v", p, c.Volumes)
		}
		for _, port := range []string{"5683/udp", "5684/udp", "1883/tcp", "8883/tcp", "9180/tcp"} {
			if _, ok := c.ExposedPorts[port]; !ok {
				t.Errorf("%v: %s not exposed: %v", p, port, c.ExposedPorts)
			}
		}
		if c.Labels["org.opencontainers.image.version"] != "1.2.3" || c.Labels["org.opencontainers.image.description"] != "Edge gateway for IoT device presence" {
			t.Errorf("%v: labels %v", p, c.Labels)
		}
		bin := "build/pkg/" + p[1] + p[2] + "/fleetgate"
		found := false
		for _, cp := range r.copies {
			found = found || (len(cp.srcs) == 1 && cp.srcs[0] == bin && cp.dst == "/usr/bin/fleetgate")
		}
		if !found {
			t.Errorf("%v: no COPY of %s to /usr/bin/fleetgate in %+v", p, bin, r.copies)
		}
	}
}

func TestEvaluate(t *testing.T) {
	r, err := evalString(t, `# comment
ARG TARGETARCH
ARG TARGETVARIANT
ARG NAME=def
FROM scratch
COPY --chown=1:2 --chmod=0640 a/${TARGETARCH}$TARGETVARIANT b /dst/
ENV A=1 \
    # a comment inside a continued line
    B="two words" C='$lit'
ENV D=$A-${NAME}
LABEL x="y z"
EXPOSE 53/udp 80
VOLUME ["/v1", "/v2/"]
USER 10
WORKDIR /w
ENTRYPOINT ["/bin/x", "a b"]
CMD []
`, map[string]string{"NAME": "given"})
	if err != nil {
		t.Fatal(err)
	}
	if len(r.copies) != 1 {
		t.Fatalf("copies %+v", r.copies)
	}
	c := r.copies[0]
	if !reflect.DeepEqual(c.srcs, []string{"a/armv7", "b"}) || c.dst != "/dst/" || c.uid != 1 || c.gid != 2 || c.chmod == nil || *c.chmod != 0o640 || c.line != 6 {
		t.Errorf("copy %+v", c)
	}
	want := imageConfig{
		User:         "10",
		ExposedPorts: map[string]struct{}{"53/udp": {}, "80/tcp": {}},
		Env:          []string{"A=1", "B=two words", "C=$lit", "D=1-given"},
		Entrypoint:   []string{"/bin/x", "a b"},
		Cmd:          []string{},
		Volumes:      map[string]struct{}{"/v1": {}, "/v2": {}},
		WorkingDir:   "/w",
		Labels:       map[string]string{"x": "y z"},
	}
	if !reflect.DeepEqual(r.config, want) {
		t.Errorf("config\n%+v\nwant\n%+v", r.config, want)
	}
	if len(r.history) != 10 || r.history[0].emptyLayer || !r.history[1].emptyLayer {
		t.Errorf("history %+v", r.history)
	}
}

// Each mistake is refused with the file and line it is on.
func TestEvaluateRefuses(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"FROM debian\n", "Containerfile:1: FROM: \"debian\": the builder builds FROM scratch only"},
		{"COPY a /b\n", "Containerfile:1: COPY: before FROM"},
		{"FROM scratch\nRUN true\n", "Containerfile:2: RUN: not supported by this builder"},
		{"FROM scratch\nFROM scratch\n", "Containerfile:2: FROM: a second FROM"},
		{"FROM scratch\nCMD run\n", "Containerfile:2: CMD: the shell form needs a shell"},
		{"FROM scratch\nENTRYPOINT [\"a\"\n", "Containerfile:2: ENTRYPOINT: not a JSON array"},
		{"FROM scratch\nCOPY a b\n", "Containerfile:2: COPY: destination \"b\" is not an absolute path"},
		{"FROM scratch\nCOPY ../a /b\n", "Containerfile:2: COPY: source \"../a\" is not inside the build context"},
		{"FROM scratch\nCOPY /etc/passwd /b\n", "is not inside the build context"},
		{"FROM scratch\nCOPY a b /c\n", "several sources need a destination directory"},
		{"FROM scratch\nCOPY --from=x a /c\n", "flag \"--from=x\" not supported"},
		{"FROM scratch\nCOPY --chown=fleetgate a /c\n", "\"fleetgate\" is not a numeric UID[:GID]"},
		{"FROM scratch\nCOPY --chmod=999 a /c\n", "--chmod=\"999\" is not an octal mode"},
		{"FROM scratch\nCOPY $X /c\n", "Containerfile:2: COPY: $X has no value"},
		{"FROM scratch\nENV A\n", "\"A\" is not KEY=VALUE"},
		{"FROM scratch\nENV A=\"b\n", "unterminated \" quote"},
		{"FROM scratch\nEXPOSE 70000\n", "\"70000\" is not PORT[/tcp|/udp]"},
		{"FROM scratch\nEXPOSE 53/sctp\n", "is not PORT[/tcp|/udp]"},
		{"FROM scratch\nVOLUME data\n", "\"data\" is not an absolute path"},
		{"FROM scratch\nUSER a b\n", "want one argument"},
		{"FROM scratch\nWORKDIR w\n", "\"w\" is not an absolute path"},
		{"ARG 1X\nFROM scratch\n", "Containerfile:1: ARG: \"1X\" is not a variable name"},
		{"FROM scratch\nENV A=$\n", "a $ that starts no variable"},
		{"FROM scratch\nENV A=1 \\", "Containerfile:2: the instruction is continued past the end of the file"},
		{"# only a comment\n", "Containerfile: no FROM scratch"},
	} {
		_, err := evalString(t, c.src, nil)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: error %v, want %q", c.src, err, c.want)
		}
	}
	_, err := evalString(t, "ARG USED\nFROM scratch\n", map[string]string{"UNDECLARED": "x", "USED": "y"})
	if want := "Containerfile: build arguments that no ARG declares: UNDECLARED"; err == nil || err.Error() != want {
		t.Errorf("an undeclared build argument: %v, want %q", err, want)
	}
}

func TestSplitWords(t *testing.T) {
	vars := map[string]string{"A": "x y", "B_1": "z"}
	lookup := func(k string) (string, bool) { v, ok := vars[k]; return v, ok }
	for _, c := range []struct {
		in   string
		want []string
	}{
		{`a  b	c`, []string{"a", "b", "c"}},
		{`"a b" 'c $A' d\ e`, []string{"a b", "c $A", "d e"}},
		{`$A ${B_1}x "$A"`, []string{"x y", "zx", "x y"}},
		{`\$A "q\"q" ""`, []string{"$A", `q"q`, ""}},
	} {
		got, err := splitWords(c.in, lookup)
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("splitWords(%q) = %q, %v; want %q", c.in, got, err, c.want)
		}
	}
}

// FuzzContainerfile: no input makes the parser panic, and what it accepts
// evaluates to a recipe whose copies stay inside the context and land at
// absolute paths.
func FuzzContainerfile(f *testing.F) {
	src, err := os.ReadFile("../../container/Containerfile")
	if err != nil {
		f.Fatal(err)
	}
	f.Add(string(src))
	f.Add("FROM scratch\nCOPY a /b\n")
	f.Add("ARG X=1\nFROM scratch\nENV A=\"$X b\" \\\n  C='d'\n")
	f.Fuzz(func(t *testing.T, s string) {
		ins, err := parseFile("f", []byte(s))
		if err != nil {
			return
		}
		r, err := evaluate("f", ins, nil, platformArgs("linux", "amd64", ""))
		if err != nil {
			return
		}
		for _, c := range r.copies {
			if !strings.HasPrefix(c.dst, "/") {
				t.Fatalf("destination %q is not absolute", c.dst)
			}
			for _, src := range c.srcs {
				if !localPath(src) {
					t.Fatalf("source %q leaves the context", src)
				}
			}
		}
	})
}
