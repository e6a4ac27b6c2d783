package sql

import (
	"fmt"
	"regexp"
)

var dbName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// ValidDatabase reports whether name can be used as a database name without
// quoting: the statements write it into their text.
func ValidDatabase(name string) error {
	if !dbName.MatchString(name) {
		return fmt.Errorf("database name %q: want letters, digits and underscores", name)
	}
	return nil
}
