package main

import (
	"encoding/json"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
)

// instruction is one instruction of a Containerfile: its line (the first
// of a continued one), its keyword in upper case, and its text after the
// keyword, continuation lines joined.
type instruction struct {
	line int
	cmd  string
	rest string
}

// parseFile splits a Containerfile into instructions: comments and blank
// lines dropped, a line ending in a backslash continued on the next (a
// comment line inside a continued one is dropped, as Docker does).
func parseFile(name string, src []byte) ([]instruction, error) {
	var out []instruction
	lines := strings.Split(strings.ReplaceAll(string(src), "\r\n", "\n"), "\n")
	for i := 0; i < len(lines); i++ {
		first := i + 1
		l := strings.TrimSpace(lines[i])
		if l == "" || strings.HasPrefix(l, "#") {
			continue
		}
		text := ""
		for {
			cont := strings.HasSuffix(l, "\\")
			if cont {
				l = strings.TrimSuffix(l, "\\")
			}
			text += l
			if !cont {
				break
			}
			i++
			for i < len(lines) && strings.HasPrefix(strings.TrimSpace(lines[i]), "#") {
				i++
			}
			if i == len(lines) {
				return nil, fmt.Errorf("%s:%d: the instruction is continued past the end of the file", name, first)
			}
			text += " "
			l = strings.TrimSpace(lines[i])
		}
		cmd, rest, _ := strings.Cut(strings.TrimSpace(text), " ")
		out = append(out, instruction{line: first, cmd: strings.ToUpper(cmd), rest: strings.TrimSpace(rest)})
	}
	return out, nil
}

// copyOp is one COPY: its sources (relative to the build context), its
// destination (absolute; a trailing slash: a directory), the owner it
// gives (uid, gid) and, when chmod is set, the mode it gives every file
// and directory it copies.
type copyOp struct {
	line     int
	text     string
	srcs     []string
	dst      string
	uid, gid int
	chmod    *int64
}

// recipe is a Containerfile evaluated for one platform: the COPY layers
// in order, the image configuration, and one history entry per
// instruction after FROM.
type recipe struct {
	copies  []copyOp
	config  imageConfig
	history []historyEntry
}

// imageConfig is the part of the OCI image configuration that a
// Containerfile sets.
type imageConfig struct {
	User         string
	ExposedPorts map[string]struct{}
	Env          []string
	Entrypoint   []string
	Cmd          []string
	Volumes      map[string]struct{}
	WorkingDir   string
	Labels       map[string]string
}

type historyEntry struct {
	createdBy  string
	emptyLayer bool
}

// platformArgs are the build arguments every build defines for its
// platform, usable once declared with ARG (as BuildKit's).
func platformArgs(os, arch, variant string) map[string]string {
	p := os + "/" + arch
	if variant != "" {
		p += "/" + variant
	}
	return map[string]string{"TARGETOS": os, "TARGETARCH": arch, "TARGETVARIANT": variant, "TARGETPLATFORM": p}
}

// evaluate evaluates the instructions of the Containerfile name for one
// platform. args are the build arguments given (-arg) and the platform's
// (platformArgs); a given argument that no ARG declares is an error, and
// so is a reference to an argument or variable with no value. The
// builder builds images FROM scratch only and knows no RUN: an
// instruction it does not implement is an error naming it.
func evaluate(name string, ins []instruction, given, platform map[string]string) (*recipe, error) {
	r := &recipe{}
	vars := map[string]string{}
	declared := map[string]bool{}
	from := false
	for _, in := range ins {
		errf := func(format string, a ...any) error {
			return fmt.Errorf("%s:%d: %s: %s", name, in.line, in.cmd, fmt.Sprintf(format, a...))
		}
		if !from && in.cmd != "ARG" && in.cmd != "FROM" {
			return nil, errf("before FROM (the first instruction must be FROM scratch, after ARGs)")
		}
		lookup := func(v string) (string, bool) { s, ok := vars[v]; return s, ok }
		words := func() ([]string, error) {
			w, err := splitWords(in.rest, lookup)
			if err != nil {
				return nil, errf("%v", err)
			}
			return w, nil
		}
		switch in.cmd {
		case "FROM":
			if from {
				return nil, errf("a second FROM: the builder builds one stage")
			}
			w, err := words()
			if err != nil {
				return nil, err
			}
			if len(w) != 1 || w[0] != "scratch" {
				return nil, errf("%q: the builder builds FROM scratch only", in.rest)
			}
			from = true
			continue
		case "ARG":
			w, err := words()
			if err != nil {
				return nil, err
			}
			if len(w) != 1 {
				return nil, errf("want one NAME or NAME=default, got %q", in.rest)
			}
			k, def, hasDef := strings.Cut(w[0], "=")
			if !validName(k) {
				return nil, errf("%q is not a variable name", k)
			}
			declared[k] = true
			if v, ok := platform[k]; ok {
				vars[k] = v
			} else if v, ok := given[k]; ok {
				vars[k] = v
			} else if hasDef {
				vars[k] = def
			}
			continue
		case "COPY":
			c, err := parseCopy(in, lookup)
			if err != nil {
				return nil, errf("%v", err)
			}
			r.copies = append(r.copies, c)
			r.history = append(r.history, historyEntry{createdBy: "COPY " + in.rest})
			continue
		case "ENV", "LABEL":
			w, err := words()
			if err != nil {
				return nil, err
			}
			if len(w) == 0 {
				return nil, errf("want KEY=VALUE ...")
			}
			for _, kv := range w {
				k, v, ok := strings.Cut(kv, "=")
				if !ok || k == "" || (in.cmd == "ENV" && !validName(k)) {
					return nil, errf("%q is not KEY=VALUE", kv)
				}
				if in.cmd == "ENV" {
					vars[k] = v
					r.config.Env = setEnv(r.config.Env, k, v)
				} else {
					if r.config.Labels == nil {
						r.config.Labels = map[string]string{}
					}
					r.config.Labels[k] = v
				}
			}
		case "EXPOSE":
			w, err := words()
			if err != nil {
				return nil, err
			}
			if len(w) == 0 {
				return nil, errf("want PORT[/tcp|/udp] ...")
			}
			for _, p := range w {
				port, proto, hasProto := strings.Cut(p, "/")
				if !hasProto {
					proto = "tcp"
				}
				if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || (proto != "tcp" && proto != "udp") {
					return nil, errf("%q is not PORT[/tcp|/udp]", p)
				}
				if r.config.ExposedPorts == nil {
					r.config.ExposedPorts = map[string]struct{}{}
				}
				r.config.ExposedPorts[port+"/"+proto] = struct{}{}
			}
		case "VOLUME":
			var vols []string
			if strings.HasPrefix(in.rest, "[") {
				if err := json.Unmarshal([]byte(in.rest), &vols); err != nil {
					return nil, errf("not a JSON array of strings: %v", err)
				}
			} else {
				w, err := words()
				if err != nil {
					return nil, err
				}
				vols = w
			}
			if len(vols) == 0 {
				return nil, errf("want a path")
			}
			for _, v := range vols {
				if !path.IsAbs(v) {
					return nil, errf("%q is not an absolute path", v)
				}
				if r.config.Volumes == nil {
					r.config.Volumes = map[string]struct{}{}
				}
				r.config.Volumes[path.Clean(v)] = struct{}{}
			}
		case "USER", "WORKDIR":
			w, err := words()
			if err != nil {
				return nil, err
			}
			if len(w) != 1 {
				return nil, errf("want one argument, got %q", in.rest)
			}
			if in.cmd == "USER" {
				if _, _, err := ownerIDs(w[0]); err != nil {
					return nil, errf("%v", err)
				}
				r.config.User = w[0]
			} else {
				if !path.IsAbs(w[0]) {
					return nil, errf("%q is not an absolute path", w[0])
				}
				r.config.WorkingDir = path.Clean(w[0])
			}
		case "ENTRYPOINT", "CMD":
			var argv []string
			if !strings.HasPrefix(in.rest, "[") {
				return nil, errf("the shell form needs a shell, and the image has none: use the JSON form [\"...\"]")
			}
			if err := json.Unmarshal([]byte(in.rest), &argv); err != nil {
				return nil, errf("not a JSON array of strings: %v", err)
			}
			if in.cmd == "ENTRYPOINT" {
				if len(argv) == 0 {
					return nil, errf("empty")
				}
				r.config.Entrypoint = argv
			} else {
				r.config.Cmd = argv
			}
		default:
			return nil, errf("not supported by this builder (it builds FROM scratch with COPY, and no RUN)")
		}
		r.history = append(r.history, historyEntry{createdBy: in.cmd + " " + in.rest, emptyLayer: true})
	}
	if !from {
		return nil, fmt.Errorf("%s: no FROM scratch", name)
	}
	var unused []string
	for k := range given {
		if !declared[k] {
			unused = append(unused, k)
		}
	}
	if len(unused) > 0 {
		sort.Strings(unused)
		return nil, fmt.Errorf("%s: build arguments that no ARG declares: %s", name, strings.Join(unused, ", "))
	}
	return r, nil
}

// parseCopy reads COPY [--chown=UID:GID] [--chmod=MODE] SRC... DEST.
func parseCopy(in instruction, lookup func(string) (string, bool)) (copyOp, error) {
	c := copyOp{line: in.line, text: "COPY " + in.rest}
	w, err := splitWords(in.rest, lookup)
	if err != nil {
		return c, err
	}
	for len(w) > 0 && strings.HasPrefix(w[0], "--") {
		k, v, _ := strings.Cut(w[0], "=")
		switch k {
		case "--chown":
			if c.uid, c.gid, err = ownerIDs(v); err != nil {
				return c, err
			}
		case "--chmod":
			m, err := strconv.ParseInt(v, 8, 32)
			if err != nil || m < 0 || m > 07777 {
				return c, fmt.Errorf("--chmod=%q is not an octal mode", v)
			}
			c.chmod = &m
		default:
			return c, fmt.Errorf("flag %q not supported (--chown=UID:GID and --chmod=MODE are)", w[0])
		}
		w = w[1:]
	}
	if len(w) < 2 {
		return c, fmt.Errorf("want SRC... DEST")
	}
	c.srcs, c.dst = w[:len(w)-1], w[len(w)-1]
	if !path.IsAbs(c.dst) {
		return c, fmt.Errorf("destination %q is not an absolute path", c.dst)
	}
	if len(c.srcs) > 1 && !strings.HasSuffix(c.dst, "/") {
		return c, fmt.Errorf("several sources need a destination directory ending in /, got %q", c.dst)
	}
	for _, s := range c.srcs {
		if !localPath(s) {
			return c, fmt.Errorf("source %q is not inside the build context", s)
		}
	}
	return c, nil
}

// localPath reports whether p, a slash-separated path, stays inside the
// directory it is relative to.
func localPath(p string) bool {
	c := path.Clean(p)
	return p != "" && !path.IsAbs(p) && c != ".." && !strings.HasPrefix(c, "../")
}

// ownerIDs reads a numeric UID[:GID] (the GID defaults to the UID): the
// image has no user database that the builder reads.
func ownerIDs(s string) (uid, gid int, err error) {
	u, g, hasG := strings.Cut(s, ":")
	if !hasG {
		g = u
	}
	uid, err1 := strconv.Atoi(u)
	gid, err2 := strconv.Atoi(g)
	if err1 != nil || err2 != nil || uid < 0 || gid < 0 || uid > 1<<31-1 || gid > 1<<31-1 {
		return 0, 0, fmt.Errorf("%q is not a numeric UID[:GID]", s)
	}
	return uid, gid, nil
}

func validName(s string) bool {
	if s == "" || (s[0] >= '0' && s[0] <= '9') {
		return false
	}
	for _, r := range s {
		if !(r == '_' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return true
}

func setEnv(env []string, k, v string) []string {
	for i, e := range env {
		if strings.HasPrefix(e, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

// splitWords splits s into words as a shell would, for the subset a
// Containerfile's arguments use: white space separates words, double
// quotes group (\" and \\ escape inside them), single quotes group
// literally, a backslash outside quotes escapes the next character, and
// $NAME or ${NAME} outside single quotes is replaced by lookup's value
// (a name without one is an error).
func splitWords(s string, lookup func(string) (string, bool)) ([]string, error) {
	var words []string
	var cur strings.Builder
	inWord := false
	var quote byte
	for i := 0; i < len(s); i++ {
		ch := s[i]
		switch {
		case quote == '\'':
			if ch == '\'' {
				quote = 0
			} else {
				cur.WriteByte(ch)
			}
			continue
		case ch == '\\' && i+1 < len(s) && (quote == 0 || s[i+1] == '"' || s[i+1] == '\\' || s[i+1] == '$'):
			i++
			cur.WriteByte(s[i])
			inWord = true
			continue
		case ch == '"':
			if quote == '"' {
				quote = 0
			} else {
				quote = '"'
			}
			inWord = true
			continue
		case ch == '\'' && quote == 0:
			quote = '\''
			inWord = true
			continue
		case ch == '$':
			name, n := varName(s[i+1:])
			if n == 0 {
				return nil, fmt.Errorf("a $ that starts no variable at %q", s[i:])
			}
			v, ok := lookup(name)
			if !ok {
				return nil, fmt.Errorf("$%s has no value (declare it with ARG or ENV, give it with -arg)", name)
			}
			cur.WriteString(v)
			inWord = true
			i += n
			continue
		case quote == 0 && (ch == ' ' || ch == '\t'):
			if inWord {
				words = append(words, cur.String())
				cur.Reset()
				inWord = false
			}
			continue
		}
		cur.WriteByte(ch)
		inWord = true
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		words = append(words, cur.String())
	}
	return words, nil
}

// varName reads NAME or {NAME} at the start of s: the name and the bytes
// it takes (0: none).
func varName(s string) (string, int) {
	if strings.HasPrefix(s, "{") {
		end := strings.IndexByte(s, '}')
		if end < 2 || !validName(s[1:end]) {
			return "", 0
		}
		return s[1:end], end + 1
	}
	n := 0
	for n < len(s) && (s[n] == '_' || s[n] >= 'a' && s[n] <= 'z' || s[n] >= 'A' && s[n] <= 'Z' || n > 0 && s[n] >= '0' && s[n] <= '9') {
		n++
	}
	return s[:n], n
}
