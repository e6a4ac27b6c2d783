//go:build nochdb

package chdb

import "errors"

// errNotBuilt is what Open answers in a binary built without the loader.
var errNotBuilt = errors.New("this binary was built without the ClickHouse engine loader (tag nochdb, as the container images are, since they hold a static binary and no C library): " +
	"run the report from files with an auditsink built by `go build` or `go install` on a machine with glibc")

type conn struct{}

func load(string) error                            { return errNotBuilt }
func connect(string) (*conn, error)                { return nil, errNotBuilt }
func (*conn) query([]byte, string) ([]byte, error) { return nil, errNotBuilt }
func (*conn) close()                               {}
