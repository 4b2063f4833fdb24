package main

import (
	"archive/tar"
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"
)

// entry is one file or directory of a layer.
type entry struct {
	name     string // without a leading slash; directories end in /
	mode     int64
	uid, gid int
	src      string // the file to read; "" for a directory
}

// tarMode is the tar mode bits of m: permissions, setuid, setgid, sticky.
func tarMode(m fs.FileMode) int64 {
	t := int64(m.Perm())
	if m&fs.ModeSetuid != 0 {
		t |= 04000
	}
	if m&fs.ModeSetgid != 0 {
		t |= 02000
	}
	if m&fs.ModeSticky != 0 {
		t |= 01000
	}
	return t
}

// copyEntries lists what c copies from the build context dir: the
// destination's missing parent directories (root's, 0755, as Docker
// makes them), then each source: a file to the destination (into it
// when it ends in / or there are several sources), a directory's
// contents into the destination, the destination directory itself
// taking the source directory's mode. Only regular files and
// directories are copied; anything else is an error.
func copyEntries(dir string, c copyOp) ([]entry, error) {
	byName := map[string]entry{}
	add := func(e entry) { byName[e.name] = e }
	dst := strings.TrimPrefix(path.Clean(c.dst), "/")
	intoDir := strings.HasSuffix(c.dst, "/")
	mode := func(m fs.FileMode) int64 {
		if c.chmod != nil {
			return *c.chmod
		}
		return tarMode(m)
	}
	parents := func(p string) {
		for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
			if _, ok := byName[d+"/"]; !ok {
				add(entry{name: d + "/", mode: 0o755})
			}
		}
	}
	for _, s := range c.srcs {
		root := filepath.Join(dir, filepath.FromSlash(path.Clean(s)))
		fi, err := os.Lstat(root)
		if err != nil {
			return nil, fmt.Errorf("%d: COPY %s: %w", c.line, s, err)
		}
		switch {
		case fi.Mode().IsRegular():
			name := dst
			if intoDir || len(c.srcs) > 1 {
				name = path.Join(dst, path.Base(path.Clean(s)))
			}
			parents(name)
			add(entry{name: name, mode: mode(fi.Mode()), uid: c.uid, gid: c.gid, src: root})
		case fi.IsDir():
			if dst != "" {
				parents(dst)
			}
			err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
				if err != nil {
					return err
				}
				info, err := d.Info()
				if err != nil {
					return err
				}
				rel, err := filepath.Rel(root, p)
				if err != nil {
					return err
				}
				name := path.Join(dst, filepath.ToSlash(rel))
				switch {
				case info.IsDir():
					if name == "" || name == "." {
						return nil // the image's root: not an entry
					}
					add(entry{name: name + "/", mode: mode(info.Mode()), uid: c.uid, gid: c.gid})
				case info.Mode().IsRegular():
					add(entry{name: name, mode: mode(info.Mode()), uid: c.uid, gid: c.gid, src: p})
				default:
					return fmt.Errorf("%s: only regular files and directories are copied", p)
				}
				return nil
			})
			if err != nil {
				return nil, fmt.Errorf("%d: COPY %s: %w", c.line, s, err)
			}
		default:
			return nil, fmt.Errorf("%d: COPY %s: only regular files and directories are copied", c.line, s)
		}
	}
	out := make([]entry, 0, len(byName))
	for _, e := range byName {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

// layerTar writes entries as an uncompressed tar, every entry dated
// mtime, with numeric owners only: the same entries give the same bytes.
func layerTar(entries []entry, mtime time.Time) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: e.mode, Uid: e.uid, Gid: e.gid, ModTime: mtime, Format: tar.FormatPAX}
		var body []byte
		if e.src == "" {
			h.Typeflag = tar.TypeDir
		} else {
			b, err := os.ReadFile(e.src)
			if err != nil {
				return nil, err
			}
			h.Typeflag, h.Size, body = tar.TypeReg, int64(len(b)), b
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, err
		}
		if _, err := tw.Write(body); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
