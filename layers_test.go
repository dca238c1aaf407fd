package ckptplan_test

import (
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/ckptplan/ckptplan/"

// layers is the design's package table (DESIGN.md, "Packages"): what each
// package of the module may import of it. Arrows point one way: a package
// imports only packages of layers below its own, and nothing that plans
// (solver, costmodel, stage, planner, export) imports the executor. mem
// (byte sizes) is a leaf every package may import. A package's
// sub-packages may import what it may, each other, and their own
// sub-packages; the package may import them.
var layers = map[string][]string{
	"mem":    nil,
	"models": nil, // embedded YAML
	"ir":     nil,
	// solver knows only numbers: the standard library (solverStdlib).
	"solver":    nil,
	"graphio":   {"ir", "models"},
	"costmodel": {"ir"},
	"stage":     {"ir", "costmodel"},
	"planner":   {"ir", "graphio", "costmodel", "solver", "stage"},
	"export":    {"ir", "graphio", "costmodel", "solver", "stage", "planner"},
	"exec":      {"ir", "graphio", "costmodel", "solver", "stage", "planner"},
	"cmd":       {"ir", "graphio", "costmodel", "solver", "stage", "planner", "export", "exec", "models"},
}

// top returns the top-level package of a module-relative path.
func top(pkg string) string { return strings.Split(pkg, "/")[0] }

// allowed reports whether module package from may import module package to.
func allowed(from, to string) bool {
	if to == "mem" || top(from) == top(to) {
		return true // a leaf, or within a package and its sub-packages
	}
	return slices.Contains(layers[top(from)], top(to))
}

// imports returns the imports of the non-test Go files of every package of
// the module, all build tags included, by module-relative package path.
func imports(t *testing.T) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	err := filepath.WalkDir(".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			if name := d.Name(); path != "." && (strings.HasPrefix(name, ".") || name == "testdata" || name == "python") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(token.NewFileSet(), path, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		pkg := filepath.ToSlash(filepath.Dir(path))
		for _, s := range f.Imports {
			p, err := strconv.Unquote(s.Path.Value)
			if err != nil {
				return err
			}
			if !slices.Contains(out[pkg], p) {
				out[pkg] = append(out[pkg], p)
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// TestLayers: every package imports of the module only what the design's
// table allows it, and solver nothing outside the standard library but
// its own internal packages.
func TestLayers(t *testing.T) {
	all := imports(t)
	for _, must := range []string{"solver", "stage", "planner", "exec/kernel", "solver/internal/minplus"} {
		if all[must] == nil {
			t.Fatalf("no imports read for %s: the walk missed the module's packages", must)
		}
	}
	for pkg, imps := range all {
		if _, ok := layers[top(pkg)]; !ok {
			t.Errorf("%s is not in the design's package table", pkg)
			continue
		}
		for _, imp := range imps {
			if to, ok := strings.CutPrefix(imp, module); ok {
				if !allowed(pkg, to) {
					t.Errorf("%s imports %s, against the design's layers", pkg, to)
				}
				continue
			}
			if top(pkg) == "solver" && !strings.HasPrefix(pkg, "solver/internal/") && strings.Contains(strings.Split(imp, "/")[0], ".") {
				t.Errorf("%s imports %s: solver knows only numbers (the standard library; CPU dispatch in solver/internal)", pkg, imp)
			}
		}
	}
}

// TestLayersCatch: the check refuses the imports the design forbids.
func TestLayersCatch(t *testing.T) {
	for _, tt := range []struct {
		from, to string
		ok       bool
	}{
		{"stage", "exec/kernel", false},
		{"planner", "exec", false},
		{"graphio", "solver", false},
		{"solver", "ir", false},
		{"costmodel", "planner", false},
		{"export", "exec", false},
		{"exec/kernel", "stage/scratch", true},
		{"solver", "solver/internal/minplus", true},
		{"solver", "mem", true},
		{"cmd/ckptplan", "exec", true},
	} {
		if got := allowed(tt.from, tt.to); got != tt.ok {
			t.Errorf("%s importing %s allowed: %v, want %v", tt.from, tt.to, got, tt.ok)
		}
	}
}
