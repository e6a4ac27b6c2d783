// Package pkitest is a throwaway X.509 PKI for tests (and the demo): a CA
// that issues serving certificates for host names and IP addresses and
// client certificates with a common name, as PEM, as tls.Certificate and
// as files in the layout of a kubernetes.io/tls Secret (ca.crt, tls.crt,
// tls.key).
//
// Keys are ECDSA P-256; certificates are valid from an hour ago for 30
// days. Issuing cannot fail with these templates, so a failure is a bug
// here and panics, as httptest.NewServer does; writing files fails the
// test.
package pkitest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"
)

// CA is a self-signed certificate authority. Its serial number is 1; the
// certificates it issues are numbered from 2 up.
type CA struct {
	Cert   *x509.Certificate
	PEM    []byte // Cert as PEM
	key    *ecdsa.PrivateKey
	serial atomic.Int64
}

// Cert is a certificate a CA issued, with its key.
type Cert struct {
	TLS             tls.Certificate // Leaf is set
	CertPEM, KeyPEM []byte
}

// NewCA makes a CA whose common name is name.
func NewCA(name string) *CA {
	ca := &CA{}
	ca.serial.Store(1)
	ca.key = newKey()
	tmpl := template(1, name)
	tmpl.IsCA, tmpl.BasicConstraintsValid, tmpl.KeyUsage = true, true, x509.KeyUsageCertSign
	ca.Cert, ca.PEM = create(tmpl, tmpl, ca.key, ca.key)
	return ca
}

// Server issues a serving certificate named cn for hosts: IP addresses
// and DNS names.
func (ca *CA) Server(cn string, hosts ...string) *Cert {
	tmpl := ca.leaf(cn, x509.ExtKeyUsageServerAuth)
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	return ca.issue(tmpl)
}

// Client issues a client certificate with the common name cn.
func (ca *CA) Client(cn string) *Cert {
	return ca.issue(ca.leaf(cn, x509.ExtKeyUsageClientAuth))
}

// Pool is a pool that holds only the CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.Cert)
	return p
}

// ClientConfig is a client's TLS configuration that trusts only the CA
// and presents cert (of any CA) when cert is not nil.
func (ca *CA) ClientConfig(cert *Cert) *tls.Config {
	cfg := &tls.Config{RootCAs: ca.Pool()}
	if cert != nil {
		cfg.Certificates = []tls.Certificate{cert.TLS}
	}
	return cfg
}

// WriteFile writes the CA's PEM to dir/ca.crt and returns that path.
func (ca *CA) WriteFile(t testing.TB, dir string) string {
	t.Helper()
	return write(t, dir, "ca.crt", ca.PEM)
}

// Serial is the certificate's serial number.
func (c *Cert) Serial() int64 { return c.TLS.Leaf.SerialNumber.Int64() }

// WriteFiles writes the certificate to dir/tls.crt and its key to
// dir/tls.key, replacing what is there, and returns both paths.
func (c *Cert) WriteFiles(t testing.TB, dir string) (certFile, keyFile string) {
	t.Helper()
	return write(t, dir, "tls.crt", c.CertPEM), write(t, dir, "tls.key", c.KeyPEM)
}

func (ca *CA) leaf(cn string, usage x509.ExtKeyUsage) *x509.Certificate {
	tmpl := template(ca.serial.Add(1), cn)
	tmpl.KeyUsage, tmpl.ExtKeyUsage = x509.KeyUsageDigitalSignature, []x509.ExtKeyUsage{usage}
	return tmpl
}

func (ca *CA) issue(tmpl *x509.Certificate) *Cert {
	key := newKey()
	leaf, certPEM := create(tmpl, ca.Cert, key, ca.key)
	kb, err := x509.MarshalECPrivateKey(key)
	must(err)
	c := &Cert{CertPEM: certPEM, KeyPEM: pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb})}
	c.TLS, err = tls.X509KeyPair(c.CertPEM, c.KeyPEM)
	must(err)
	c.TLS.Leaf = leaf
	return c
}

func template(serial int64, cn string) *x509.Certificate {
	now := time.Now()
	return &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(30 * 24 * time.Hour)}
}

func create(tmpl, parent *x509.Certificate, key, signer *ecdsa.PrivateKey) (*x509.Certificate, []byte) {
	der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, signer)
	must(err)
	cert, err := x509.ParseCertificate(der)
	must(err)
	return cert, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func newKey() *ecdsa.PrivateKey {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	return key
}

func must(err error) {
	if err != nil {
		panic("pkitest: " + err.Error())
	}
}

func write(t testing.TB, dir, name string, b []byte) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, b, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
