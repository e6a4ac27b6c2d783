package chart

import (
	"archive/tar"
	"compress/gzip"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestDashboardsAreTheGeneratedFiles: the chart's dashboards directory is
// the repository's dashboards/generated (a symlink, so nothing is copied),
// and with dashboards on, each generated file becomes a ConfigMap holding
// the file's content (less its final newline).
func TestDashboardsAreTheGeneratedFiles(t *testing.T) {
	link, err := os.Readlink(filepath.Join(chartDir(t), "dashboards"))
	if err != nil || link != "../../dashboards/generated" {
		t.Fatalf("charts/stampguard/dashboards should be a symlink to ../../dashboards/generated: %q, %v", link, err)
	}
	files, err := filepath.Glob(filepath.Join(chartDir(t), "dashboards", "*.json"))
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, render(t, "cert-manager"))
	for _, f := range files {
		want, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		base := filepath.Base(f)
		found := false
		for _, o := range kinds(objs, "ConfigMap") {
			data, ok, _ := unstructured.NestedString(o.Object, "data", base)
			if !ok {
				continue
			}
			found = true
			if data != strings.TrimRight(string(want), "\n") {
				t.Errorf("ConfigMap %s does not hold the content of %s", o.GetName(), base)
			}
		}
		if !found {
			t.Errorf("no ConfigMap holds %s", base)
		}
	}
}

// TestDashboardConfigMaps renders a copy of the chart whose dashboards
// symlink points at sample files: the ConfigMaps carry the sidecar's label
// and folder annotation and the files' content, and helm package follows
// the symlink.
func TestDashboardConfigMaps(t *testing.T) {
	root := t.TempDir()
	gen := filepath.Join(root, "dashboards", "generated")
	chart := filepath.Join(root, "charts", "stampguard")
	if err := os.MkdirAll(gen, 0o755); err != nil {
		t.Fatal(err)
	}
	copyDir(t, chartDir(t), chart)
	dashboard := `{"title": "stampguard: conflicts", "panels": []}`
	rules := "apiVersion: 1\ngroups: []"
	for name, body := range map[string]string{"conflicts.json": dashboard, "alert-rules.yaml": rules} {
		if err := os.WriteFile(filepath.Join(gen, name), []byte(body+"\n"), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	out, err := helm(t, os.DevNull, "template", release, chart, "--namespace", namespace, "-f", valuesFile(t, "defaults"),
		"--set", "dashboards.enabled=true,dashboards.alerts.enabled=true,dashboards.namespace=monitoring,dashboards.label=my_dashboards,dashboards.folder=Platform")
	if err != nil {
		t.Fatal(err)
	}
	objs := objects(t, out)
	var cm, alerts corev1.ConfigMap
	find(t, objs, "ConfigMap", release+"-stampguard-dashboard-conflicts", &cm)
	find(t, objs, "ConfigMap", release+"-stampguard-alert-rules", &alerts)
	if cm.Namespace != "monitoring" || cm.Labels["my_dashboards"] != "1" || cm.Annotations["grafana_folder"] != "Platform" {
		t.Errorf("dashboard ConfigMap metadata: %+v", cm.ObjectMeta)
	}
	if cm.Data["conflicts.json"] != dashboard {
		t.Errorf("dashboard ConfigMap data %q, want the file's %q", cm.Data["conflicts.json"], dashboard)
	}
	if alerts.Labels["grafana_alert"] != "1" || alerts.Data["stampguard-alert-rules.yaml"] != rules {
		t.Errorf("alert rules ConfigMap: %+v %q", alerts.Labels, alerts.Data)
	}

	dest := t.TempDir()
	if _, err := helm(t, os.DevNull, "package", chart, "--destination", dest); err != nil {
		t.Fatal(err)
	}
	pkgs, _ := filepath.Glob(filepath.Join(dest, "*.tgz"))
	if len(pkgs) != 1 {
		t.Fatalf("helm package wrote %v", pkgs)
	}
	if names := tarNames(t, pkgs[0]); !names["stampguard/dashboards/conflicts.json"] || !names["stampguard/crds/stampguard.dev_concurrencypolicies.yaml"] {
		t.Errorf("the package lacks the dashboard or the CRD: %v", names)
	}
}

// copyDir copies the chart, keeping symlinks as symlinks.
func copyDir(t testing.TB, from, to string) {
	t.Helper()
	err := filepath.WalkDir(from, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(from, path)
		dst := filepath.Join(to, rel)
		switch {
		case d.Type()&fs.ModeSymlink != 0:
			link, err := os.Readlink(path)
			if err != nil {
				return err
			}
			return os.Symlink(link, dst)
		case d.IsDir():
			return os.MkdirAll(dst, 0o755)
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		return os.WriteFile(dst, b, 0o644)
	})
	if err != nil {
		t.Fatal(err)
	}
}

func tarNames(t testing.TB, path string) map[string]bool {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	names := map[string]bool{}
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return names
		}
		if err != nil {
			t.Fatal(err)
		}
		names[h.Name] = true
	}
}
