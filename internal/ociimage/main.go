// Command ociimage builds fleetgate's container image from a
// Containerfile into an OCI archive (an OCI image layout in one tar, as
// `podman save --format oci-archive` writes, and skopeo, podman and
// containerd read), for several platforms under one image index, with
// no daemon, no registry and no base image.
//
//	go run ./internal/ociimage -f container/Containerfile -context . \
//		-platform linux/amd64,linux/arm64,linux/arm/v7 -epoch 1767225600 \
//		-arg VERSION=1.2.3 -tag 1.2.3 -o dist/fleetgate_1.2.3_oci.tar
//
// It implements the part of the Containerfile language that an image
// FROM scratch needs: FROM scratch, ARG, COPY (--chown=UID:GID,
// --chmod=MODE), ENV, LABEL, EXPOSE, VOLUME, USER, WORKDIR, and
// ENTRYPOINT and CMD in the JSON form; anything else (RUN above all) is
// an error naming its line. Each COPY is one layer. TARGETOS,
// TARGETARCH, TARGETVARIANT and TARGETPLATFORM are the platform's, as
// BuildKit defines them.
//
// The same inputs give the same bytes: every file and directory in the
// layers and in the archive is dated -epoch (SOURCE_DATE_EPOCH by
// default), owners are numeric, entries sorted, gzip streams carry no
// time, and the JSON documents are written with sorted keys.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

type argList map[string]string

func (a argList) String() string { return fmt.Sprint(map[string]string(a)) }

func (a argList) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || !validName(k) {
		return fmt.Errorf("%q is not NAME=VALUE", s)
	}
	a[k] = v
	return nil
}

func main() {
	file := flag.String("f", "Containerfile", "the Containerfile")
	context := flag.String("context", ".", "the build context: the directory COPY's sources are relative to")
	platforms := flag.String("platform", "linux/amd64", "comma-separated OS/ARCH[/VARIANT] to build for")
	epoch := flag.String("epoch", os.Getenv("SOURCE_DATE_EPOCH"), "the date (Unix seconds) of every file and of the images (default $SOURCE_DATE_EPOCH)")
	tag := flag.String("tag", "latest", "the image's name in the archive (org.opencontainers.image.ref.name)")
	out := flag.String("o", "", "the OCI archive to write")
	args := argList{}
	flag.Var(args, "arg", "a build argument NAME=VALUE (repeatable)")
	flag.Parse()
	if *out == "" || flag.NArg() != 0 {
		flag.Usage()
		os.Exit(2)
	}
	if err := build(*file, *context, *platforms, *epoch, *tag, *out, args); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

// blob is a content-addressed file of the layout.
type blob struct {
	desc ocispec.Descriptor
	data []byte
}

func newBlob(mediaType string, data []byte) blob {
	return blob{desc: ocispec.Descriptor{MediaType: mediaType, Digest: digest.FromBytes(data), Size: int64(len(data))}, data: data}
}

func build(file, context, platforms, epoch, tag, out string, args map[string]string) error {
	secs, err := strconv.ParseInt(epoch, 10, 64)
	if err != nil || secs < 0 {
		return fmt.Errorf("-epoch (or SOURCE_DATE_EPOCH) %q is not Unix seconds", epoch)
	}
	mtime := time.Unix(secs, 0).UTC()
	src, err := os.ReadFile(file)
	if err != nil {
		return err
	}
	ins, err := parseFile(file, src)
	if err != nil {
		return err
	}
	if tag == "" || strings.ContainsAny(tag, " \t\n/") {
		return fmt.Errorf("-tag %q: want a name without white space or /", tag)
	}
	blobs := map[digest.Digest]blob{}
	keep := func(b blob) ocispec.Descriptor { blobs[b.desc.Digest] = b; return b.desc }
	var manifests []ocispec.Descriptor
	for _, p := range strings.Split(platforms, ",") {
		plat, err := parsePlatform(p)
		if err != nil {
			return err
		}
		r, err := evaluate(file, ins, args, platformArgs(plat.OS, plat.Architecture, plat.Variant))
		if err != nil {
			return err
		}
		m, err := image(context, r, plat, mtime, keep)
		if err != nil {
			return fmt.Errorf("%s: %s:%w", p, file, err)
		}
		m.Platform = &plat
		manifests = append(manifests, m)
	}
	idx, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: manifests})
	if err != nil {
		return err
	}
	d := keep(newBlob(ocispec.MediaTypeImageIndex, idx))
	d.Annotations = map[string]string{ocispec.AnnotationRefName: tag}
	top, err := json.Marshal(ocispec.Index{Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex, Manifests: []ocispec.Descriptor{d}})
	if err != nil {
		return err
	}
	layout, err := json.Marshal(ocispec.ImageLayout{Version: ocispec.ImageLayoutVersion})
	if err != nil {
		return err
	}
	return writeArchive(out, mtime, layout, top, blobs)
}

// parsePlatform reads OS/ARCH[/VARIANT].
func parsePlatform(s string) (ocispec.Platform, error) {
	f := strings.Split(strings.TrimSpace(s), "/")
	if len(f) < 2 || len(f) > 3 || f[0] == "" || f[1] == "" {
		return ocispec.Platform{}, fmt.Errorf("-platform %q: want OS/ARCH[/VARIANT]", s)
	}
	p := ocispec.Platform{OS: f[0], Architecture: f[1]}
	if len(f) == 3 {
		p.Variant = f[2]
	}
	return p, nil
}

// image builds the layers and configuration of r for plat, keeps their
// blobs, and returns the descriptor of its manifest.
func image(context string, r *recipe, plat ocispec.Platform, mtime time.Time, keep func(blob) ocispec.Descriptor) (ocispec.Descriptor, error) {
	cfg := ocispec.Image{
		Created:  &mtime,
		Platform: plat,
		Config: ocispec.ImageConfig{
			User: r.config.User, ExposedPorts: r.config.ExposedPorts, Env: r.config.Env,
			Entrypoint: r.config.Entrypoint, Cmd: r.config.Cmd, Volumes: r.config.Volumes,
			WorkingDir: r.config.WorkingDir, Labels: r.config.Labels,
		},
		RootFS: ocispec.RootFS{Type: "layers", DiffIDs: []digest.Digest{}},
	}
	for _, h := range r.history {
		cfg.History = append(cfg.History, ocispec.History{Created: &mtime, CreatedBy: h.createdBy, EmptyLayer: h.emptyLayer})
	}
	layers := []ocispec.Descriptor{}
	for _, c := range r.copies {
		entries, err := copyEntries(context, c)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		raw, err := layerTar(entries, mtime)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		var gz bytes.Buffer
		zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
		if err != nil {
			return ocispec.Descriptor{}, err
		}
		if _, err := zw.Write(raw); err != nil {
			return ocispec.Descriptor{}, err
		}
		if err := zw.Close(); err != nil {
			return ocispec.Descriptor{}, err
		}
		cfg.RootFS.DiffIDs = append(cfg.RootFS.DiffIDs, digest.FromBytes(raw))
		layers = append(layers, keep(newBlob(ocispec.MediaTypeImageLayerGzip, gz.Bytes())))
	}
	cb, err := json.Marshal(cfg)
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	mb, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: keep(newBlob(ocispec.MediaTypeImageConfig, cb)), Layers: layers,
	})
	if err != nil {
		return ocispec.Descriptor{}, err
	}
	return keep(newBlob(ocispec.MediaTypeImageManifest, mb)), nil
}

// writeArchive writes the OCI image layout as a tar: oci-layout,
// index.json and blobs/sha256/<hex>, sorted, dated mtime, owned by root,
// through a temporary file renamed into place.
func writeArchive(out string, mtime time.Time, layout, index []byte, blobs map[digest.Digest]blob) error {
	type file struct {
		name string
		data []byte
	}
	files := []file{{"index.json", index}, {"oci-layout", layout}}
	for d, b := range blobs {
		if d.Algorithm() != digest.SHA256 {
			return errors.New("only sha256 digests are written")
		}
		sum := sha256.Sum256(b.data)
		if hex.EncodeToString(sum[:]) != d.Encoded() {
			return fmt.Errorf("blob %s does not match its content", d)
		}
		files = append(files, file{"blobs/sha256/" + d.Encoded(), b.data})
	}
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	tmp := out + ".tmp"
	f, err := os.Create(tmp)
	if err != nil {
		return err
	}
	defer os.Remove(tmp)
	tw := tar.NewWriter(f)
	hdr := func(h *tar.Header) error {
		h.ModTime, h.Format = mtime, tar.FormatPAX
		return tw.WriteHeader(h)
	}
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := hdr(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755}); err != nil {
			f.Close()
			return err
		}
	}
	for _, fl := range files {
		if err := hdr(&tar.Header{Name: fl.name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(fl.data))}); err != nil {
			f.Close()
			return err
		}
		if _, err := tw.Write(fl.data); err != nil {
			f.Close()
			return err
		}
	}
	if err := tw.Close(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(tmp, out)
}
