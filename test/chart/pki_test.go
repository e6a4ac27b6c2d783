package chart

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"testing"
)

// verifyServing checks that cert (with key) is a serving certificate for
// dnsName (a host name or an IP address) that the CA in caPEM signed.
func verifyServing(t testing.TB, caPEM, certPEM, keyPEM []byte, dnsName string) {
	t.Helper()
	if _, err := tls.X509KeyPair(certPEM, keyPEM); err != nil {
		t.Fatalf("%s: certificate and key do not match: %v", dnsName, err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("%s: ca.crt holds no PEM certificate", dnsName)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatalf("%s: tls.crt holds no PEM block", dnsName)
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatalf("%s: %v", dnsName, err)
	}
	if _, err := cert.Verify(x509.VerifyOptions{DNSName: dnsName, Roots: pool, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		t.Fatalf("the serving certificate does not verify for %s: %v", dnsName, err)
	}
}
