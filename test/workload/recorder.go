package workload

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Recorder hands out clients for workloads other than the script (the
// demo's): each authenticates as the driver (DriverUser), impersonates its
// writer and records every request it sends, like the script's clients.
// Its Requests are the ground truth that Truth turns into a report.
type Recorder struct {
	driver *rest.Config
	rec    *recorder
}

// NewRecorder creates the driver account with admin (a cluster-admin
// config, not audited under AuditPolicy) and returns a Recorder. Call it
// once per control plane: the driver's namespace must not exist yet.
func NewRecorder(ctx context.Context, admin *rest.Config) (*Recorder, error) {
	cs, err := kubernetes.NewForConfig(admin)
	if err != nil {
		return nil, fmt.Errorf("admin client: %w", err)
	}
	driver, err := driverConfig(ctx, cs, admin)
	if err != nil {
		return nil, err
	}
	return &Recorder{driver: driver, rec: newRecorder()}, nil
}

func newRecorder() *recorder { return &recorder{now: time.Now} }

// Config is writer's rest.Config: the driver impersonating writer (with
// system:masters, so that RBAC stays out of the way), recorded.
func (r *Recorder) Config(writer string) *rest.Config {
	cfg := rest.CopyConfig(r.driver)
	cfg.Impersonate = rest.ImpersonationConfig{UserName: writer, Groups: []string{"system:masters"}}
	cfg.WrapTransport = func(next http.RoundTripper) http.RoundTripper { return inFlight{r.rec.wrap(next)} }
	return cfg
}

// inFlight lets a request that was sent finish even when its context ends
// (a writer stopping, a leader election cancelled): the apiserver would
// audit it, and the record must hold it too.
type inFlight struct{ next http.RoundTripper }

func (t inFlight) RoundTrip(req *http.Request) (*http.Response, error) {
	return t.next.RoundTrip(req.WithContext(context.WithoutCancel(req.Context())))
}

// Client is Config as a clientset.
func (r *Recorder) Client(writer string) (kubernetes.Interface, error) {
	c, err := kubernetes.NewForConfig(r.Config(writer))
	if err != nil {
		return nil, fmt.Errorf("client for %s: %w", writer, err)
	}
	return c, nil
}

// Requests returns a copy of every request recorded so far, in the order
// the responses arrived.
func (r *Recorder) Requests() []Request { return r.rec.requests() }
