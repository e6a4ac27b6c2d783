package app

import (
	"flag"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stampguard/stampguard/internal/cli"
)

// certDir is a directory with the two files --cert-dir must hold.
func certDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	for _, name := range []string{"tls.crt", "tls.key"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

func resolveServeFlags(t *testing.T, args ...string) (Options, error) {
	t.Helper()
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	var f ServeFlags
	f.Register(fs)
	if err := fs.Parse(append([]string{"--cert-dir", certDir(t)}, args...)); err != nil {
		t.Fatalf("parse %q: %v", args, err)
	}
	return f.Resolve(io.Discard)
}

// writeKubeconfig writes a kubeconfig naming server.
func writeKubeconfig(t *testing.T, server string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeconfig")
	kc := "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster: {server: " + server + "}\n" +
		"contexts:\n- name: c\n  context: {cluster: c, user: u}\ncurrent-context: c\nusers:\n- name: u\n  user: {token: t}\n"
	if err := os.WriteFile(p, []byte(kc), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestWebhookFlagsBeatTheEnvironment is the webhook's flag rule: an
// explicit flag beats the environment, the environment beats the files and
// defaults (the in-cluster config).
func TestWebhookFlagsBeatTheEnvironment(t *testing.T) {
	t.Setenv(KubeconfigEnv, writeKubeconfig(t, "https://from-env:6443"))
	t.Setenv(NamespaceEnv, "from-env")
	o, err := resolveServeFlags(t, "--kubeconfig", writeKubeconfig(t, "https://from-flag:6443"), "--namespace", "from-flag")
	if err != nil || o.RestConfig.Host != "https://from-flag:6443" || o.Namespace != "from-flag" {
		t.Fatalf("with flags: host %v, namespace %q (%v); want the flags'", o.RestConfig, o.Namespace, err)
	}
	o, err = resolveServeFlags(t)
	if err != nil || o.RestConfig.Host != "https://from-env:6443" || o.Namespace != "from-env" {
		t.Fatalf("without flags: host %v, namespace %q (%v); want the environment's", o.RestConfig, o.Namespace, err)
	}
	t.Setenv(KubeconfigEnv, "")
	t.Setenv("KUBERNETES_SERVICE_HOST", "")
	_, err = resolveServeFlags(t)
	if err == nil || !strings.Contains(err.Error(), "give --kubeconfig FILE (or $KUBECONFIG) for cluster mode outside a pod, or --policy-file FILE for file mode") {
		t.Fatalf("no cluster at all: %v", err)
	}
}

func TestWebhookFlagsRefuseWhatTheyCannotDo(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty.yaml")
	if err := os.WriteFile(empty, []byte("# nothing\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv(KubeconfigEnv, writeKubeconfig(t, "https://127.0.0.1:6443"))
	examples := filepath.Join("..", "..", "..", "examples", "policies.yaml")
	for args, want := range map[string]string{
		"--port 0":               "--port 0: want 1 to 65535",
		"--port 70000":           "--port 70000: want 1 to 65535",
		"--max-review-bytes 0":   "--max-review-bytes 0: want a positive number of bytes (default 8388608)",
		"--shutdown-timeout 0s":  "--shutdown-timeout 0s: want a positive duration (default 25s)",
		"--log-level loud":       `--log-level "loud": want debug, info, warn or error`,
		"--log-format xml":       `--log-format "xml": want json or text`,
		"--policy-file " + empty: "--policy-file " + empty + " holds no policies: the webhook would guard nothing",
		"--sync-configurations= --sync-resources configmaps":      "--sync-resources needs --sync-configurations NAME: without it the webhook leaves the configurations alone",
		"--sync-configurations= --sync-namespace-selector team=a": "--sync-namespace-selector needs --sync-configurations NAME: without it the webhook leaves the configurations alone",
		"--sync-configurations s --sync-resources a/*":            `--sync-resources: resource "a/*": name resources; a wildcard would send every write in the cluster, leases and events included, to the webhook`,
		"--policy-file " + examples + " --sync-configurations s":  "--policy-file is file mode; --sync-configurations and --kubeconfig are for cluster mode: give one mode (in file mode, print the configurations with `webhook configurations --policy-file`)",
	} {
		_, err := resolveServeFlags(t, strings.Fields(args)...)
		if err == nil || err.Error() != want || cli.ExitCode(err) != cli.ExitUsage {
			t.Errorf("%s: %v, want the usage error %q", args, err, want)
		}
	}
	fs := flag.NewFlagSet("webhook", flag.ContinueOnError)
	var f ServeFlags
	f.Register(fs)
	if err := fs.Parse([]string{"--cert-dir", t.TempDir()}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Resolve(io.Discard); err == nil || !strings.HasPrefix(err.Error(), "--cert-dir: ") || !strings.Contains(err.Error(), "tls.crt") {
		t.Errorf("a --cert-dir without tls.crt: %v", err)
	}
	o, err := resolveServeFlags(t, "--policy-file", examples)
	if err != nil || o.PolicyFile != examples || o.RestConfig != nil || o.Port != DefaultPort || o.ShutdownTimeout != DefaultShutdownTimeout {
		t.Errorf("file mode: %+v (%v)", o, err)
	}
}
