package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// tinyContext writes a build context and a Containerfile that copies a
// per-arch file, a directory with a sticky subdirectory, and an owned,
// re-moded directory.
func tinyContext(t *testing.T) (dir, file string) {
	t.Helper()
	dir = t.TempDir()
	for _, f := range []struct {
		name string
		mode os.FileMode
	}{{"bin/amd64/app", 0o755}, {"bin/armv7/app", 0o755}, {"root/etc/passwd", 0o644}} {
		p := filepath.Join(dir, f.name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f.name+"\n"), f.mode); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"root/tmp", "state"} {
		if err := os.MkdirAll(filepath.Join(dir, d), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Chmod(filepath.Join(dir, "root/tmp"), 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	file = filepath.Join(dir, "Containerfile")
	src := `FROM scratch
ARG TARGETARCH
ARG TARGETVARIANT
ARG VERSION
COPY root/ /
COPY --chown=7:8 --chmod=0750 state/ /var/lib/app/
COPY bin/${TARGETARCH}${TARGETVARIANT}/app /usr/bin/app
USER 7:8
LABEL version=${VERSION}
ENTRYPOINT ["/usr/bin/app"]
`
	if err := os.WriteFile(file, []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir, file
}

// readArchive reads the OCI archive's files by name.
func readArchive(t *testing.T, path string) map[string][]byte {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = b
	}
}

func blobOf(t *testing.T, files map[string][]byte, d ocispec.Descriptor, v any) []byte {
	t.Helper()
	b, ok := files["blobs/sha256/"+d.Digest.Encoded()]
	if !ok || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: missing or not %d bytes", d.Digest, d.Size)
	}
	if v != nil {
		if err := json.Unmarshal(b, v); err != nil {
			t.Fatal(err)
		}
	}
	return b
}

type layerEntry struct {
	mode     int64
	uid, gid int
	body     string
}

func layerEntries(t *testing.T, gz []byte) map[string]layerEntry {
	t.Helper()
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	out := map[string]layerEntry{}
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(tr)
		if h.ModTime.Unix() != 1700000000 {
			t.Errorf("%s dated %v", h.Name, h.ModTime)
		}
		out[h.Name] = layerEntry{h.Mode, h.Uid, h.Gid, string(b)}
	}
}

func TestBuild(t *testing.T) {
	dir, file := tinyContext(t)
	out := filepath.Join(t.TempDir(), "img.tar")
	if err := build(file, dir, "linux/amd64,linux/arm/v7", "1700000000", "1.2.3", out, map[string]string{"VERSION": "1.2.3"}); err != nil {
		t.Fatal(err)
	}
	files := readArchive(t, out)
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout %s", files["oci-layout"])
	}
	var top, idx ocispec.Index
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	if len(top.Manifests) != 1 || top.Manifests[0].MediaType != ocispec.MediaTypeImageIndex || top.Manifests[0].Annotations[ocispec.AnnotationRefName] != "1.2.3" {
		t.Fatalf("index.json %+v", top)
	}
	blobOf(t, files, top.Manifests[0], &idx)
	if len(idx.Manifests) != 2 {
		t.Fatalf("image index %+v", idx)
	}
	for i, want := range []ocispec.Platform{{OS: "linux", Architecture: "amd64"}, {OS: "linux", Architecture: "arm", Variant: "v7"}} {
		d := idx.Manifests[i]
		if d.Platform == nil || !reflect.DeepEqual(*d.Platform, want) {
			t.Errorf("manifest %d platform %+v, want %+v", i, d.Platform, want)
			continue
		}
		var m ocispec.Manifest
		var cfg ocispec.Image
		blobOf(t, files, d, &m)
		blobOf(t, files, m.Config, &cfg)
		if cfg.Architecture != want.Architecture || cfg.Variant != want.Variant || cfg.Config.User != "7:8" ||
			!reflect.DeepEqual(cfg.Config.Entrypoint, []string{"/usr/bin/app"}) || cfg.Config.Labels["version"] != "1.2.3" ||
			cfg.Created == nil || cfg.Created.Unix() != 1700000000 {
			t.Errorf("%v: config %+v", want, cfg)
		}
		if len(m.Layers) != 3 || len(cfg.RootFS.DiffIDs) != 3 {
			t.Fatalf("%v: %d layers, %d diff IDs, want 3", want, len(m.Layers), len(cfg.RootFS.DiffIDs))
		}
		var all = map[string]layerEntry{}
		for _, l := range m.Layers {
			for k, v := range layerEntries(t, blobOf(t, files, l, nil)) {
				all[k] = v
			}
		}
		arch := want.Architecture + want.Variant
		wantEntries := map[string]layerEntry{
			"etc/":         {0o755, 0, 0, ""},
			"etc/passwd":   {0o644, 0, 0, "root/etc/passwd\n"},
			"tmp/":         {0o1777, 0, 0, ""},
			"var/":         {0o755, 0, 0, ""},
			"var/lib/":     {0o755, 0, 0, ""},
			"var/lib/app/": {0o750, 7, 8, ""},
			"usr/":         {0o755, 0, 0, ""},
			"usr/bin/":     {0o755, 0, 0, ""},
			"usr/bin/app":  {0o755, 0, 0, "bin/" + arch + "/app\n"},
		}
		if !reflect.DeepEqual(all, wantEntries) {
			t.Errorf("%v: layers hold\n%v\nwant\n%v", want, all, wantEntries)
		}
	}

	// The same inputs give the same bytes.
	again := filepath.Join(t.TempDir(), "img.tar")
	if err := build(file, dir, "linux/amd64,linux/arm/v7", "1700000000", "1.2.3", again, map[string]string{"VERSION": "1.2.3"}); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(out)
	b, _ := os.ReadFile(again)
	if !bytes.Equal(a, b) {
		t.Error("two builds of the same inputs differ")
	}

	// skopeo reads the archive: the index, and each platform's image.
	raw := skopeo(t, "inspect", "--raw", "oci-archive:"+out+":1.2.3")
	if !strings.Contains(raw, `"variant":"v7"`) {
		t.Errorf("skopeo inspect --raw: %s", raw)
	}
	var info struct {
		Architecture string
		Labels       map[string]string
		Layers       []string
	}
	if err := json.Unmarshal([]byte(skopeo(t, "--override-arch", "arm", "--override-variant", "v7", "inspect", "oci-archive:"+out+":1.2.3")), &info); err != nil {
		t.Fatal(err)
	}
	if info.Architecture != "arm" || info.Labels["version"] != "1.2.3" || len(info.Layers) != 3 {
		t.Errorf("skopeo inspect arm/v7: %+v", info)
	}
	copyDir := filepath.Join(t.TempDir(), "copy")
	skopeo(t, "copy", "--all", "oci-archive:"+out+":1.2.3", "oci:"+copyDir+":1.2.3")
}

func skopeo(t *testing.T, args ...string) string {
	t.Helper()
	if _, err := exec.LookPath("skopeo"); err != nil {
		t.Fatalf("skopeo not installed (make deps installs it): %v", err)
	}
	out, err := exec.Command("skopeo", args...).CombinedOutput()
	if err != nil {
		t.Fatalf("skopeo %v: %v\n%s", args, err, out)
	}
	return string(out)
}

func TestBuildRefuses(t *testing.T) {
	dir, file := tinyContext(t)
	out := filepath.Join(t.TempDir(), "img.tar")
	for _, c := range []struct {
		platforms, epoch, tag string
		args                  map[string]string
		want                  string
	}{
		{"linux/amd64", "x", "t", nil, "-epoch (or SOURCE_DATE_EPOCH) \"x\" is not Unix seconds"},
		{"linux", "1", "t", nil, "-platform \"linux\": want OS/ARCH[/VARIANT]"},
		{"linux/amd64", "1", "a b", nil, "-tag \"a b\""},
		{"linux/riscv64", "1", "t", map[string]string{"VERSION": "1"}, "linux/riscv64: " + file + ":7: COPY bin/riscv64/app: "},
	} {
		err := build(file, dir, c.platforms, c.epoch, c.tag, out, c.args)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c, err, c.want)
		}
	}
	if _, err := os.Stat(out); err == nil {
		t.Error("a failed build left its archive")
	}
}
