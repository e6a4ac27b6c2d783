package pkitest

import (
	"crypto/tls"
	"crypto/x509"
	"os"
	"testing"
)

func TestIssuedCertificatesVerify(t *testing.T) {
	ca := NewCA("test-ca")
	srv, cli := ca.Server("sink", "127.0.0.1", "sink.example"), ca.Client("kube-apiserver")
	for _, host := range []string{"127.0.0.1", "sink.example"} {
		if _, err := srv.TLS.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: ca.Pool()}); err != nil {
			t.Errorf("the server certificate for %s: %v", host, err)
		}
	}
	if _, err := cli.TLS.Leaf.Verify(x509.VerifyOptions{Roots: ca.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		t.Errorf("the client certificate: %v", err)
	}
	if _, err := srv.TLS.Leaf.Verify(x509.VerifyOptions{DNSName: "127.0.0.1", Roots: NewCA("other").Pool()}); err == nil {
		t.Error("another CA verified the server certificate")
	}
	if srv.Serial() != 2 || cli.Serial() != 3 {
		t.Errorf("serials %d, %d; want 2, 3", srv.Serial(), cli.Serial())
	}
	dir := t.TempDir()
	certFile, keyFile := srv.WriteFiles(t, dir)
	if _, err := tls.LoadX509KeyPair(certFile, keyFile); err != nil {
		t.Error(err)
	}
	if b, err := os.ReadFile(ca.WriteFile(t, dir)); err != nil || !x509.NewCertPool().AppendCertsFromPEM(b) {
		t.Errorf("ca.crt: %v", err)
	}
}
