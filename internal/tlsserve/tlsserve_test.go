package tlsserve

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stampguard/stampguard/test/pkitest"
)

func holds(pool *x509.CertPool, c *x509.Certificate) bool {
	want := x509.NewCertPool()
	want.AddCert(c)
	return pool.Equal(want)
}

// A CA file follows its file: a renewal replaces the pool within about
// CheckEvery; a broken file leaves the pool it had and says why.
func TestCAFileFollowsItsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ca.crt")
	first := pkitest.NewCA("first")
	if err := os.WriteFile(path, first.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCAFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !holds(ca.Pool(), first.Cert) {
		t.Fatal("the pool does not hold the file's CA")
	}
	next := pkitest.NewCA("next")
	if err := os.WriteFile(path+".new", next.PEM, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !holds(ca.Pool(), next.Cert) {
		if time.Now().After(deadline) {
			t.Fatal("the renewed CA was not loaded within 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.WriteFile(path, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(CheckEvery + 100*time.Millisecond)
	if !holds(ca.Pool(), next.Cert) || ca.Err() == nil {
		t.Fatalf("a broken file: the pool changed or no error (%v)", ca.Err())
	}
	if _, err := LoadCAFile(path); err == nil {
		t.Fatal("LoadCAFile accepted a file without certificates")
	}
}

func TestConfigIsTLS12AEADAndHTTP11(t *testing.T) {
	c := Config()
	if c.MinVersion != tls.VersionTLS12 || !slices.Equal(c.NextProtos, []string{"http/1.1"}) {
		t.Fatalf("config %+v", c)
	}
	insecure := map[uint16]bool{}
	for _, s := range tls.InsecureCipherSuites() {
		insecure[s.ID] = true
	}
	for _, s := range tls.CipherSuites() {
		if slices.Contains(c.CipherSuites, s.ID) && (insecure[s.ID] || !slices.Contains(s.SupportedVersions, tls.VersionTLS12)) {
			t.Errorf("suite %s offered", s.Name)
		}
	}
	for _, id := range c.CipherSuites {
		if name := tls.CipherSuiteName(id); !strings.Contains(name, "_GCM_") && !strings.Contains(name, "CHACHA20_POLY1305") {
			t.Errorf("suite %s is not AEAD", name)
		}
	}
}
