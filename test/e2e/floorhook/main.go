// Command floorhook is BenchmarkRefusal's floor: an admission webhook
// server set up as stampguard's admission port is (tlsserve's TLS and
// HTTP/1.1, net/http with the same timeouts and header bound) whose
// handler does the least any webhook must: it reads the review, finds its
// uid and answers a fixed denial, naming the protocol the apiserver
// spoke. Its CPU per call is what the Go HTTP server, TLS and the runtime
// cost a webhook whatever it decides; what stampguard's webhook spends
// above it is its own handler's.
//
// Not for production: it refuses every write it is sent.
package main

import (
	"bytes"
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stampguard/stampguard/internal/tlsserve"
)

func main() {
	addr := flag.String("addr", "", "host:port to serve on")
	certDir := flag.String("cert-dir", "", "directory holding tls.crt and tls.key")
	flag.Parse()
	if *addr == "" || *certDir == "" || flag.NArg() > 0 {
		fmt.Fprintln(os.Stderr, "usage: floorhook --addr HOST:PORT --cert-dir DIR")
		os.Exit(2)
	}
	certs, err := tlsserve.New(tlsserve.Options{CertFile: filepath.Join(*certDir, "tls.crt"), KeyFile: filepath.Join(*certDir, "tls.key")})
	if err != nil {
		log.Fatal(err)
	}
	ln, err := net.Listen("tcp", *addr)
	if err != nil {
		log.Fatal(err)
	}
	var conns atomic.Int64 // as the webhook counts its connections
	srv := &http.Server{
		Handler:           http.HandlerFunc(answer),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       10 * time.Second,
		MaxHeaderBytes:    64 << 10,
		IdleTimeout:       90 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
		ConnState: func(_ net.Conn, state http.ConnState) {
			if state == http.StateNew {
				conns.Add(1)
			}
		},
	}
	fmt.Println("serving", ln.Addr())
	log.Fatal(srv.Serve(tls.NewListener(ln, certs.TLSConfig())))
}

var buffers = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// uidKey starts the review's request.uid: the apiserver writes request
// first and uid first in it, so the first occurrence is that one (an
// answer with another uid would be refused by the apiserver, and the
// benchmark with it).
var uidKey = []byte(`"uid":"`)

func answer(w http.ResponseWriter, r *http.Request) {
	buf := buffers.Get().(*bytes.Buffer)
	buf.Reset()
	defer buffers.Put(buf)
	if _, err := buf.ReadFrom(r.Body); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	body := buf.Bytes()
	i := bytes.Index(body, uidKey)
	if i < 0 {
		http.Error(w, "no uid", http.StatusBadRequest)
		return
	}
	uid := body[i+len(uidKey):]
	uid = uid[:max(0, bytes.IndexByte(uid, '"'))]
	out := make([]byte, 0, 512)
	out = append(out, `{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","response":{"uid":"`...)
	out = append(out, uid...)
	out = append(out, `","allowed":false,"status":{"status":"Failure","code":422,"reason":"Invalid","message":"floorhook refuses every write (`...)
	out = append(out, r.Proto...)
	out = append(out, `)"}}}`...)
	w.Header()["Content-Type"] = []string{"application/json"}
	_, _ = w.Write(out)
}
