//go:build nochdb

package chdb

// built says that this binary has no loader.
const built = false

type conn struct{}

func load(string) error                            { return errNotBuilt }
func connect(string) (*conn, error)                { return nil, errNotBuilt }
func (*conn) query([]byte, string) ([]byte, error) { return nil, errNotBuilt }
func (*conn) close()                               {}
