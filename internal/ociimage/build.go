package ociimage

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"

	"sigs.k8s.io/yaml"
)

// Images are the binaries that get an image, by name; the chart's default
// repositories are <Registry>/<name>.
var Images = []struct{ Name, Package, Description string }{
	{"webhook", "./cmd/webhook", "stampguard's admission webhook: refuses stampless updates, enforces field owners, immutable fields and delete preconditions"},
	{"auditsink", "./cmd/auditsink", "stampguard's audit sink: stores kube-apiserver audit events in ClickHouse exactly once"},
}

// Defaults of BuildOptions.
const (
	DefaultRegistry       = "ghcr.io/stampguard"
	DefaultCACertificates = "/etc/ssl/certs/ca-certificates.crt" // Debian's ca-certificates
	Source                = "https://github.com/stampguard/stampguard"
)

// BuildOptions say what Build builds.
type BuildOptions struct {
	// RepoRoot is the module's directory. Required.
	RepoRoot string
	// OutDir receives <name>-<version>-linux-<arch>.tar. Required.
	OutDir string
	// Version tags the images. Defaults to the chart's appVersion, which
	// the chart's image tags default to.
	Version string
	// Registry prefixes the image names. Defaults to DefaultRegistry.
	Registry string
	// Arch is the GOARCH to build for. Defaults to the running one.
	Arch string
	// CACertificates is the PEM bundle to install. Defaults to
	// DefaultCACertificates.
	CACertificates string
	// Revision, when set, is the org.opencontainers.image.revision label
	// (the commit).
	Revision string
}

// Build compiles each of Images statically (CGO_ENABLED=0, the tag nochdb
// that leaves out the loader of the in-process engine, which would link
// the binary against the C library, -trimpath, no build ID, so the same
// commit gives the same bytes) and writes its archive. It returns the archives' paths.
func Build(ctx context.Context, o BuildOptions) ([]string, error) {
	if o.RepoRoot == "" || o.OutDir == "" {
		return nil, fmt.Errorf("build images: the repository root and the output directory are required")
	}
	if o.Version == "" {
		v, err := ChartAppVersion(o.RepoRoot)
		if err != nil {
			return nil, err
		}
		o.Version = v
	}
	o.Registry = cmp.Or(o.Registry, DefaultRegistry)
	o.Arch = cmp.Or(o.Arch, runtime.GOARCH)
	o.CACertificates = cmp.Or(o.CACertificates, DefaultCACertificates)
	if err := os.MkdirAll(o.OutDir, 0o755); err != nil {
		return nil, fmt.Errorf("build images: %w", err)
	}
	tmp, err := os.MkdirTemp("", "stampguard-images-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	var out []string
	for _, im := range Images {
		bin := filepath.Join(tmp, im.Name)
		cmd := exec.CommandContext(ctx, "go", "build", "-tags=nochdb", "-trimpath", "-ldflags=-s -w -buildid=", "-o", bin, im.Package)
		cmd.Dir = o.RepoRoot
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH="+o.Arch, "GOFLAGS=-mod=readonly")
		if b, err := cmd.CombinedOutput(); err != nil {
			return nil, fmt.Errorf("go build %s: %w\n%s", im.Package, err, b)
		}
		labels := map[string]string{
			"org.opencontainers.image.title":       im.Name,
			"org.opencontainers.image.description": im.Description,
			"org.opencontainers.image.version":     o.Version,
			"org.opencontainers.image.source":      Source,
		}
		if o.Revision != "" {
			labels["org.opencontainers.image.revision"] = o.Revision
		}
		path := filepath.Join(o.OutDir, fmt.Sprintf("%s-%s-linux-%s.tar", im.Name, o.Version, o.Arch))
		if err := writeFile(path, Image{
			Ref: o.Registry + "/" + im.Name + ":" + o.Version, Binary: bin, BinaryName: im.Name,
			CACertificates: o.CACertificates, Labels: labels,
		}, o.Arch); err != nil {
			return nil, fmt.Errorf("write image %s: %w", path, err)
		}
		out = append(out, path)
	}
	return out, nil
}

func writeFile(path string, img Image, arch string) error {
	f, err := os.Create(path + ".part")
	if err != nil {
		return err
	}
	if err := Write(f, img, arch); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(path+".part", path)
}

// ChartAppVersion reads appVersion from charts/stampguard/Chart.yaml.
func ChartAppVersion(repoRoot string) (string, error) {
	p := filepath.Join(repoRoot, "charts", "stampguard", "Chart.yaml")
	b, err := os.ReadFile(p)
	if err != nil {
		return "", fmt.Errorf("read the chart's appVersion: %w", err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(b, &c); err != nil || strings.TrimSpace(c.AppVersion) == "" {
		return "", fmt.Errorf("%s: no appVersion (%w)", p, err)
	}
	return c.AppVersion, nil
}
