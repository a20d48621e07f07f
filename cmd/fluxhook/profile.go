package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime/pprof"
)

// startProfile starts a CPU profile of the whole run into dir/cpu.pprof; the returned function
// stops it and writes dir/allocs.pprof (every allocation since start). A file rather than a
// /debug/pprof endpoint: `fluxhook bench` profiles a workload from the dispatcher's first claim
// to its drain without guessing a duration, and nothing extra listens in production.
func startProfile(dir string) (func() error, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("PROFILE_DIR: %w", err)
	}
	f, err := os.Create(filepath.Join(dir, "cpu.pprof"))
	if err != nil {
		return nil, fmt.Errorf("PROFILE_DIR: %w", err)
	}
	if err := pprof.StartCPUProfile(f); err != nil {
		f.Close()
		return nil, fmt.Errorf("PROFILE_DIR: starting the CPU profile: %w", err)
	}
	return func() error {
		pprof.StopCPUProfile()
		errCPU := f.Close()
		a, err := os.Create(filepath.Join(dir, "allocs.pprof"))
		if err != nil {
			return errors.Join(errCPU, err)
		}
		errAllocs := pprof.Lookup("allocs").WriteTo(a, 0)
		return errors.Join(errCPU, errAllocs, a.Close())
	}, nil
}
