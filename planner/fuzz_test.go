package planner

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/mem"
)

// FuzzReadPlan: any input either reads as a plan whose schedule replays
// on its own stages, or is refused with an error; nothing panics. Seeded
// with real plans and the hostile corpus's plan files.
func FuzzReadPlan(f *testing.F) {
	for _, model := range []string{"tiny-llama", "tiny-gpt2"} {
		src, err := graphio.Load(model)
		if err != nil {
			f.Fatal(err)
		}
		p, err := New(src)
		if err != nil {
			f.Fatal(err)
		}
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
		if err := plan.checkSchedule(); err != nil {
			t.Fatalf("read a plan whose schedule does not replay: %v", err)
		}
	})
}
