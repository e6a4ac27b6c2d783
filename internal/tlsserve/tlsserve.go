// Package tlsserve is the server side of TLS that both of stampguard's
// servers share, the webhook's admission port and the audit sink: TLS 1.2
// or later with AEAD cipher suites only, HTTP/1.1 only, a serving
// certificate and a client CA bundle that follow their files on disk, so
// that a renewal (cert-manager, a rotated Secret) applies without a
// restart.
package tlsserve

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/certwatcher"
)

// CipherSuites are the TLS 1.2 suites offered: ECDHE key exchange with
// AES-GCM or ChaCha20-Poly1305, all AEAD and forward secret. Go's TLS 1.3
// suites are all AEAD and not configurable.
var CipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// Config is the base server configuration: TLS >= 1.2, CipherSuites, and
// HTTP/1.1 only. HTTP/2 is off as controller-runtime and kubebuilder
// advise since the stream-cancellation ("Rapid Reset", CVE-2023-44487)
// and CONTINUATION flood attacks: its streams multiply what one
// connection may ask of the server, and the apiserver's admission and
// audit clients speak HTTP/1.1 just as well.
func Config() *tls.Config {
	return &tls.Config{
		MinVersion:   tls.VersionTLS12,
		CipherSuites: CipherSuites,
		NextProtos:   []string{"http/1.1"},
	}
}

// Options name the files of a Server.
type Options struct {
	// CertFile and KeyFile are the serving certificate and key (PEM);
	// both required. They are reloaded when they change.
	CertFile, KeyFile string
	// ClientCAFile, when set, is a PEM bundle of the CAs that sign client
	// certificates; reloaded when it changes.
	ClientCAFile string
	// RequireClientCert makes the handshake require a client certificate
	// that chains to ClientCAFile. Off, a certificate is only requested
	// and the caller verifies it (VerifyClient), so that other credentials
	// may still decide.
	RequireClientCert bool
}

// Server serves TLS with the files of Options, reloaded from disk.
type Server struct {
	certs *certwatcher.CertWatcher
	cas   *CAFile
	o     Options
}

// New loads the files once; Start keeps the certificate in step with them.
func New(o Options) (*Server, error) {
	if o.CertFile == "" || o.KeyFile == "" {
		return nil, errors.New("TLS needs a certificate file and a key file")
	}
	if o.RequireClientCert && o.ClientCAFile == "" {
		return nil, errors.New("requiring client certificates needs a client CA file")
	}
	certs, err := certwatcher.New(o.CertFile, o.KeyFile)
	if err != nil {
		return nil, fmt.Errorf("load TLS certificate %s: %w", o.CertFile, err)
	}
	s := &Server{certs: certs, o: o}
	if o.ClientCAFile != "" {
		if s.cas, err = LoadCAFile(o.ClientCAFile); err != nil {
			return nil, err
		}
	}
	return s, nil
}

// Start watches the certificate and key until ctx ends (controller-runtime's
// certwatcher: file events, and a poll every 10 s). The client CA file is
// checked on use instead (CAFile.Pool).
func (s *Server) Start(ctx context.Context) error {
	return s.certs.Start(ctx)
}

// TLSConfig is Config with the reloaded certificate and, with a client CA,
// client certificates requested (or required and verified) against the
// CA bundle in force at each handshake.
func (s *Server) TLSConfig() *tls.Config {
	cfg := Config()
	cfg.GetCertificate = s.certs.GetCertificate
	if s.cas == nil {
		return cfg
	}
	if !s.o.RequireClientCert {
		// No acceptable CAs are named, so that a client sends its
		// certificate whatever its CA and the caller decides.
		cfg.ClientAuth = tls.RequestClientCert
		return cfg
	}
	cfg.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		c := Config()
		c.GetCertificate = s.certs.GetCertificate
		c.ClientAuth = tls.RequireAndVerifyClientCert
		c.ClientCAs = s.cas.Pool()
		return c, nil
	}
	return cfg
}

// VerifyClient checks a client certificate chain against the client CA in
// force, for client authentication, as tls.VerifyClientCertIfGiven would
// in the handshake. It fails without a client CA.
func (s *Server) VerifyClient(certs []*x509.Certificate) error {
	if s.cas == nil {
		return errors.New("no client CA configured")
	}
	if len(certs) == 0 {
		return errors.New("no client certificate")
	}
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	_, err := certs[0].Verify(x509.VerifyOptions{Roots: s.cas.Pool(), Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	return err
}

// HasClientCA reports whether client certificates are verified.
func (s *Server) HasClientCA() bool { return s.cas != nil }

// CAFile is a PEM bundle of CA certificates that follows its file: Pool
// looks at the file at most once per CheckEvery and re-reads it when its
// size or modification time changed (a Secret volume swaps a symlink, a
// renewal rewrites the file). A file that became unreadable or holds no
// certificate leaves the pool it had, and Err says why.
type CAFile struct {
	path string

	mu      sync.Mutex
	checked time.Time
	pem     []byte
	pool    *x509.CertPool
	err     error
}

// CheckEvery is how often CAFile.Pool looks at the file.
const CheckEvery = time.Second

// LoadCAFile reads path, which must hold at least one PEM certificate.
func LoadCAFile(path string) (*CAFile, error) {
	c := &CAFile{path: path}
	if err := c.reload(time.Now()); err != nil {
		return nil, err
	}
	return c, nil
}

// Pool is the CA pool of the file as last read.
func (c *CAFile) Pool() *x509.CertPool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if now := time.Now(); now.Sub(c.checked) >= CheckEvery {
		c.err = c.reload(now)
	}
	return c.pool
}

// Err is the reason the last look at the file failed; nil when the pool
// is the file's.
func (c *CAFile) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// reload runs with c.mu held (or before c is shared). It reads the file
// every time: a CA bundle is small, and a stat could miss a renewal of
// the same size within one tick of the file system's clock.
func (c *CAFile) reload(now time.Time) error {
	c.checked = now
	b, err := os.ReadFile(c.path)
	if err != nil {
		return fmt.Errorf("read client CA %s: %w", c.path, err)
	}
	if c.pool != nil && bytes.Equal(b, c.pem) {
		return nil
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(b) {
		return fmt.Errorf("client CA %s holds no PEM certificates", c.path)
	}
	c.pool, c.pem = pool, b
	return nil
}
