package cli

import (
	"fmt"
	"os"
	"runtime/pprof"
)

// StartCPUProfile writes a Go CPU profile (pprof) to path until the
// returned stop is called: both commands' --cpu-profile (diagnostics).
func StartCPUProfile(path string) (stop func() error, err error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("--cpu-profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		if err := f.Close(); err != nil {
			return fmt.Errorf("write CPU profile %s: %w", path, err)
		}
		return nil
	}, nil
}
