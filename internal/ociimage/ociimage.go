// Package ociimage writes OCI image archives of stampguard's binaries
// without Docker and without a base image: one layer holding the static
// binary, the CA certificates and a non-root user, written reproducibly
// (fixed timestamps and owners, sorted entries), as an OCI image layout in
// a tar file (an "oci-archive", which skopeo, crane, podman and
// containerd import).
//
// It uses only the standard library: the format is small, and the
// product's module keeps no image-building dependency.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"time"
)

// Media types of the OCI image spec v1.
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
	// RefNameAnnotation names the image in the layout's index.
	RefNameAnnotation = "org.opencontainers.image.ref.name"
)

// NonRootUID is the user and group the images run as (distroless's
// "nonroot"; the chart's security contexts default to it).
const NonRootUID = 65532

// Image describes one image.
type Image struct {
	// Ref is the name and tag, e.g. ghcr.io/stampguard/webhook:0.1.0.
	Ref string
	// Binary is the static executable, installed as /<BinaryName>.
	Binary     string
	BinaryName string
	// CACertificates is a PEM bundle installed as
	// /etc/ssl/certs/ca-certificates.crt, where Go's crypto/x509 looks.
	CACertificates string
	// Labels of the image config (org.opencontainers.image.*).
	Labels map[string]string
	// Created is the image's creation time; zero means the Unix epoch,
	// so that the same inputs give the same bytes.
	Created time.Time
}

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform of an image.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Config is the part of the OCI image config the images set.
type Config struct {
	Created      string      `json:"created"`
	Architecture string      `json:"architecture"`
	OS           string      `json:"os"`
	Config       ImageConfig `json:"config"`
	RootFS       struct {
		Type    string   `json:"type"`
		DiffIDs []string `json:"diff_ids"`
	} `json:"rootfs"`
}

// ImageConfig is the execution config of an image.
type ImageConfig struct {
	User       string            `json:"User"`
	Entrypoint []string          `json:"Entrypoint"`
	Env        []string          `json:"Env"`
	WorkingDir string            `json:"WorkingDir"`
	Labels     map[string]string `json:"Labels"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Config        Descriptor   `json:"config"`
	Layers        []Descriptor `json:"layers"`
}

// Index is an OCI image index (index.json of a layout).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

type file struct {
	name string
	mode int64
	uid  int
	data []byte // nil: a directory
}

// Write writes img as an OCI archive for linux/arch to w.
func Write(w io.Writer, img Image, arch string) error {
	bin, err := os.ReadFile(img.Binary)
	if err != nil {
		return fmt.Errorf("read binary: %w", err)
	}
	ca, err := os.ReadFile(img.CACertificates)
	if err != nil {
		return fmt.Errorf("read CA certificates: %w", err)
	}
	created := img.Created
	if created.IsZero() {
		created = time.Unix(0, 0)
	}
	files := []file{
		{name: "etc/", mode: 0o755},
		{name: "etc/passwd", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:%d:%d:nonroot:/home/nonroot:/sbin/nologin\n", NonRootUID, NonRootUID))},
		{name: "etc/group", mode: 0o644, data: []byte(fmt.Sprintf("root:x:0:\nnonroot:x:%d:\n", NonRootUID))},
		{name: "etc/ssl/", mode: 0o755},
		{name: "etc/ssl/certs/", mode: 0o755},
		{name: "etc/ssl/certs/ca-certificates.crt", mode: 0o644, data: ca},
		{name: "home/", mode: 0o755},
		{name: "home/nonroot/", mode: 0o700, uid: NonRootUID},
		{name: "tmp/", mode: 0o1777},
		{name: img.BinaryName, mode: 0o755, data: bin},
	}
	layer, diffID, err := layerTarGz(files, created)
	if err != nil {
		return err
	}
	var cfg Config
	cfg.Created = created.UTC().Format(time.RFC3339)
	cfg.Architecture, cfg.OS = arch, "linux"
	cfg.Config = ImageConfig{
		User:       fmt.Sprintf("%d:%d", NonRootUID, NonRootUID),
		Entrypoint: []string{"/" + img.BinaryName},
		Env:        []string{"PATH=/", "SSL_CERT_FILE=/etc/ssl/certs/ca-certificates.crt"},
		WorkingDir: "/home/nonroot",
		Labels:     img.Labels,
	}
	cfg.RootFS.Type = "layers"
	cfg.RootFS.DiffIDs = []string{diffID}
	cfgJSON, err := json.Marshal(cfg)
	if err != nil {
		return err
	}
	man := Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest,
		Config: descriptor(MediaTypeConfig, cfgJSON), Layers: []Descriptor{descriptor(MediaTypeLayer, layer)}}
	manJSON, err := json.Marshal(man)
	if err != nil {
		return err
	}
	manDesc := descriptor(MediaTypeManifest, manJSON)
	manDesc.Annotations = map[string]string{RefNameAnnotation: img.Ref}
	manDesc.Platform = &Platform{Architecture: arch, OS: "linux"}
	idx, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{manDesc}})
	if err != nil {
		return err
	}

	tw := tar.NewWriter(w)
	entries := []struct {
		name string
		data []byte
	}{
		{"oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)},
		{"index.json", idx},
		{"blobs/", nil},
		{"blobs/sha256/", nil},
		{blobPath(cfgJSON), cfgJSON},
		{blobPath(layer), layer},
		{blobPath(manJSON), manJSON},
	}
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Mode: 0o644, Size: int64(len(e.data)), ModTime: created, Typeflag: tar.TypeReg, Format: tar.FormatPAX}
		if e.data == nil {
			h.Typeflag, h.Mode = tar.TypeDir, 0o755
		}
		if err := tw.WriteHeader(h); err != nil {
			return err
		}
		if _, err := tw.Write(e.data); err != nil {
			return err
		}
	}
	return tw.Close()
}

// layerTarGz returns the gzipped layer and the digest of its uncompressed
// tar (the config's diff ID).
func layerTarGz(files []file, mtime time.Time) ([]byte, string, error) {
	sort.Slice(files, func(i, j int) bool { return files[i].name < files[j].name })
	var raw bytes.Buffer
	tw := tar.NewWriter(&raw)
	for _, f := range files {
		h := &tar.Header{Name: f.name, Mode: f.mode, Uid: f.uid, Gid: f.uid, ModTime: mtime, Format: tar.FormatPAX}
		if f.data == nil {
			h.Typeflag = tar.TypeDir
		} else {
			h.Typeflag, h.Size = tar.TypeReg, int64(len(f.data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, "", fmt.Errorf("layer: %s: %w", f.name, err)
		}
		if _, err := tw.Write(f.data); err != nil {
			return nil, "", fmt.Errorf("layer: %s: %w", f.name, err)
		}
	}
	if err := tw.Close(); err != nil {
		return nil, "", err
	}
	sum := sha256.Sum256(raw.Bytes())
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, "", err
	}
	if _, err := zw.Write(raw.Bytes()); err != nil {
		return nil, "", err
	}
	if err := zw.Close(); err != nil {
		return nil, "", err
	}
	return gz.Bytes(), "sha256:" + hex.EncodeToString(sum[:]), nil
}

func descriptor(mediaType string, b []byte) Descriptor {
	sum := sha256.Sum256(b)
	return Descriptor{MediaType: mediaType, Digest: "sha256:" + hex.EncodeToString(sum[:]), Size: int64(len(b))}
}

func blobPath(b []byte) string {
	sum := sha256.Sum256(b)
	return path.Join("blobs", "sha256", hex.EncodeToString(sum[:]))
}
