package graphio

import (
	"os"
	"path/filepath"
	"testing"
)

// addSeeds adds every file matching the patterns to a fuzz corpus.
func addSeeds(f *testing.F, patterns ...string) {
	f.Helper()
	for _, pattern := range patterns {
		paths, err := filepath.Glob(pattern)
		if err != nil {
			f.Fatal(err)
		}
		if len(paths) == 0 {
			f.Fatalf("no seed matches %s", pattern)
		}
		for _, path := range paths {
			data, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			f.Add(data)
		}
	}
}
