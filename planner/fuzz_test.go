package planner

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
	"github.com/google/go-cmp/cmp"
)

// FuzzReadPlan: any input is read as a plan or refused with an error,
// never a panic; a plan it reads writes back as JSON that reads as the
// same plan. Seeded with real plans and the hostile corpus's plan files.
func FuzzReadPlan(f *testing.F) {
	for _, model := range []string{"tiny-llama", "tiny-gpt2"} {
		p := load(f, model)
		plan, err := p.Plan(&Options{Budget: 5 * mem.MiB})
		if err != nil {
			f.Fatal(err)
		}
		data, _ := json.Marshal(plan)
		f.Add(data)
	}
	paths, _ := filepath.Glob("../cmd/ckptplan/testdata/hostile/plan-*.json")
	for _, path := range paths {
		data, err := os.ReadFile(path)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		plan, err := ReadPlan(bytes.NewReader(data))
		if err != nil {
			return
		}
		again, err := json.Marshal(plan)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ReadPlan(bytes.NewReader(again))
		if err != nil {
			t.Fatalf("a plan read from %q does not read back: %v", data, err)
		}
		if diff := cmp.Diff(plan, back); diff != "" {
			t.Fatalf("plan changes when written and read back (-first +second)\n%s", diff)
		}
	})
}
