package graphio

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// wantRE finds the expected error a bad input carries: a "# want: ..."
// line in YAML, a "_want" key in JSON. Inputs that cannot carry one (empty
// or binary files) have it in a NAME.want file beside them.
var wantRE = regexp.MustCompile(`(?m)(?:^#\s*want:\s*(.*)$|"_want"\s*:\s*"((?:[^"\\]|\\.)*)")`)

func expectedError(t *testing.T, path string, data []byte) string {
	if side, err := os.ReadFile(path + ".want"); err == nil {
		return strings.TrimSpace(string(side))
	}
	m := wantRE.FindSubmatch(data)
	if m == nil {
		t.Fatalf("%s carries no expected error (# want: or \"_want\", or a .want file)", path)
	}
	w := string(m[1]) + string(m[2])
	return strings.ReplaceAll(strings.TrimSpace(w), `\"`, `"`)
}

// TestBadInputs loads every file of testdata/bad and checks that it fails
// with an error that starts with the file's name and contains the expected
// text (which usually starts with line:col).
func TestBadInputs(t *testing.T) {
	files, err := filepath.Glob("testdata/bad/*")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, path := range files {
		if strings.HasSuffix(path, ".want") {
			continue
		}
		n++
		t.Run(filepath.Base(path), func(t *testing.T) {
			data, err := os.ReadFile(path)
			if err != nil {
				t.Fatal(err)
			}
			want := expectedError(t, path, data)
			src, err := Load(path)
			if err == nil {
				err = buildSource(src)
			}
			if err == nil {
				t.Fatalf("Load(%s) succeeded, want error containing %q", path, want)
			}
			msg := err.Error()
			if !strings.HasPrefix(msg, path+":") {
				t.Errorf("error does not start with %q:\n%s", path+":", msg)
			}
			if !strings.Contains(msg, want) {
				t.Errorf("error = %q\nwant it to contain %q", msg, want)
			}
		})
	}
	if n < 25 {
		t.Errorf("bad-input corpus has %d cases, want at least 25", n)
	}
}

// buildSource expands a loaded source the way the CLI would, since some
// problems (shapes, cycles) only show when the graph is built.
func buildSource(src *Source) error {
	switch src.Kind {
	case KindModel:
		_, err := Build(src.Model)
		return err
	case KindGraph:
		_, err := src.Graph.Build()
		return err
	}
	return nil
}
