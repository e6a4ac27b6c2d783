package tlsserve

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func caPEM(t *testing.T, cn string) ([]byte, *x509.Certificate) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), cert
}

func holds(pool *x509.CertPool, c *x509.Certificate) bool {
	want := x509.NewCertPool()
	want.AddCert(c)
	return pool.Equal(want)
}

// A CA file follows its file: a renewal replaces the pool within about
// CheckEvery; a broken file leaves the pool it had and says why.
func TestCAFileFollowsItsFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "ca.crt")
	first, firstCert := caPEM(t, "first")
	if err := os.WriteFile(path, first, 0o600); err != nil {
		t.Fatal(err)
	}
	ca, err := LoadCAFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !holds(ca.Pool(), firstCert) {
		t.Fatal("the pool does not hold the file's CA")
	}
	next, nextCert := caPEM(t, "next")
	if err := os.WriteFile(path+".new", next, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(path+".new", path); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for !holds(ca.Pool(), nextCert) {
		if time.Now().After(deadline) {
			t.Fatal("the renewed CA was not loaded within 10 s")
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := os.WriteFile(path, []byte("not PEM"), 0o600); err != nil {
		t.Fatal(err)
	}
	time.Sleep(CheckEvery + 100*time.Millisecond)
	if !holds(ca.Pool(), nextCert) || ca.Err() == nil {
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
