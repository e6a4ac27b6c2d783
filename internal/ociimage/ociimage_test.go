package ociimage_test

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"crypto/x509"
	"debug/elf"
	"encoding/hex"
	"encoding/json"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"sigs.k8s.io/yaml"

	"github.com/stampguard/stampguard/internal/ociimage"
	"github.com/stampguard/stampguard/test/kubetest"
	"github.com/stampguard/stampguard/test/testenv"
)

// TestImages builds the archives as `make images` does, twice, and opens
// them as a registry client would: the same commit gives the same bytes;
// each archive is an OCI layout whose index names the image the chart's
// defaults pull; its config runs the binary as the non-root user; its one
// layer holds a static binary that answers -h, the CA certificates and
// the user.
func TestImages(t *testing.T) {
	testenv.SkipIfShort(t, "builds both binaries")
	root := kubetest.RepoRoot(t)
	first, err := ociimage.Build(t.Context(), ociimage.BuildOptions{RepoRoot: root, OutDir: t.TempDir(), Revision: "test"})
	if err != nil {
		t.Fatal(err)
	}
	again, err := ociimage.Build(t.Context(), ociimage.BuildOptions{RepoRoot: root, OutDir: t.TempDir(), Revision: "test"})
	if err != nil {
		t.Fatal(err)
	}
	version, err := ociimage.ChartAppVersion(root)
	if err != nil {
		t.Fatal(err)
	}
	repos := chartRepositories(t, root)
	for i, path := range first {
		name := ociimage.Images[i].Name
		t.Run(name, func(t *testing.T) {
			a, b := read(t, path), read(t, again[i])
			if !bytes.Equal(a, b) {
				t.Errorf("two builds of %s differ", filepath.Base(path))
			}
			blobs := untar(t, bytes.NewReader(a))
			if string(blobs["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
				t.Errorf("oci-layout %q", blobs["oci-layout"])
			}
			var idx ociimage.Index
			decode(t, blobs["index.json"], &idx)
			if len(idx.Manifests) != 1 {
				t.Fatalf("index %+v: want one manifest", idx)
			}
			want := repos[name] + ":" + version
			if got := idx.Manifests[0].Annotations[ociimage.RefNameAnnotation]; got != want {
				t.Errorf("image %q, want %q (the chart's default repository and appVersion)", got, want)
			}
			var man ociimage.Manifest
			decode(t, blob(t, blobs, idx.Manifests[0]), &man)
			var cfg ociimage.Config
			decode(t, blob(t, blobs, man.Config), &cfg)
			if cfg.Config.User != "65532:65532" || len(cfg.Config.Entrypoint) != 1 || cfg.Config.Entrypoint[0] != "/"+name || cfg.OS != "linux" {
				t.Errorf("config %+v", cfg.Config)
			}
			for k, v := range map[string]string{
				"org.opencontainers.image.version": version, "org.opencontainers.image.source": ociimage.Source,
				"org.opencontainers.image.title": name, "org.opencontainers.image.revision": "test",
			} {
				if cfg.Config.Labels[k] != v {
					t.Errorf("label %s = %q, want %q", k, cfg.Config.Labels[k], v)
				}
			}
			if len(man.Layers) != 1 || man.Layers[0].MediaType != ociimage.MediaTypeLayer {
				t.Fatalf("layers %+v", man.Layers)
			}
			gz, err := gzip.NewReader(bytes.NewReader(blob(t, blobs, man.Layers[0])))
			if err != nil {
				t.Fatal(err)
			}
			raw, err := io.ReadAll(gz)
			if err != nil {
				t.Fatal(err)
			}
			if sum := sha256.Sum256(raw); "sha256:"+hex.EncodeToString(sum[:]) != cfg.RootFS.DiffIDs[0] {
				t.Errorf("the layer's diff ID is not the digest of its tar")
			}
			files := untar(t, bytes.NewReader(raw))
			if !x509.NewCertPool().AppendCertsFromPEM(files["etc/ssl/certs/ca-certificates.crt"]) {
				t.Errorf("no CA certificates at /etc/ssl/certs/ca-certificates.crt")
			}
			if !strings.Contains(string(files["etc/passwd"]), "nonroot:x:65532:65532:") {
				t.Errorf("/etc/passwd lacks the non-root user:\n%s", files["etc/passwd"])
			}
			bin := filepath.Join(t.TempDir(), name)
			if err := os.WriteFile(bin, files[name], 0o755); err != nil {
				t.Fatal(err)
			}
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatalf("the image's /%s: %v", name, err)
			}
			for _, p := range f.Progs {
				if p.Type == elf.PT_INTERP {
					t.Errorf("/%s is dynamically linked (it names an interpreter)", name)
				}
			}
			f.Close()
			// The command the chart runs: the webhook itself, the sink's serve.
			help := map[string][]string{"webhook": {"-h"}, "auditsink": {"serve", "-h"}}[name]
			cmd := exec.Command(bin, help...)
			cmd.Dir, cmd.Env = t.TempDir(), []string{} // nothing from the host but the kernel
			out, err := cmd.CombinedOutput()
			if err != nil || !strings.Contains(strings.ToLower(string(out)), "usage") {
				t.Errorf("/%s %s: %v\n%s", name, strings.Join(help, " "), err, out)
			}
		})
	}
}

// chartRepositories reads the default image repositories of values.yaml.
func chartRepositories(t *testing.T, root string) map[string]string {
	t.Helper()
	var v struct {
		Webhook, AuditSink struct {
			Image struct{ Repository, Tag string }
		}
	}
	decodeYAML(t, read(t, filepath.Join(root, "charts", "stampguard", "values.yaml")), &v)
	if v.Webhook.Image.Tag != "" || v.AuditSink.Image.Tag != "" {
		t.Fatalf("the chart's default tags are not the appVersion: %+v", v)
	}
	return map[string]string{"webhook": v.Webhook.Image.Repository, "auditsink": v.AuditSink.Image.Repository}
}

// blob returns the blob d names, checking its size and digest.
func blob(t *testing.T, blobs map[string][]byte, d ociimage.Descriptor) []byte {
	t.Helper()
	hexDigest, ok := strings.CutPrefix(d.Digest, "sha256:")
	if !ok {
		t.Fatalf("digest %q", d.Digest)
	}
	b, ok := blobs["blobs/sha256/"+hexDigest]
	if !ok {
		t.Fatalf("no blob %s", d.Digest)
	}
	if sum := sha256.Sum256(b); hex.EncodeToString(sum[:]) != hexDigest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s does not match its descriptor", d.Digest)
	}
	return b
}

func untar(t *testing.T, r io.Reader) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return out
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		out[h.Name] = b
	}
}

func read(t *testing.T, path string) []byte {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func decode(t *testing.T, b []byte, into any) {
	t.Helper()
	if err := json.Unmarshal(b, into); err != nil {
		t.Fatalf("decode %s: %v", b, err)
	}
}

func decodeYAML(t *testing.T, b []byte, into any) {
	t.Helper()
	if err := yaml.Unmarshal(b, into); err != nil {
		t.Fatal(err)
	}
}
