package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// exportedPlan returns the plan a PyTorch export embeds.
func exportedPlan(t *testing.T, module string) map[string]any {
	t.Helper()
	m := regexp.MustCompile(`(?s)PLAN = json\.loads\(r'''(.*?)'''\)`).FindStringSubmatch(module)
	if m == nil {
		t.Fatalf("no PLAN in the export:\n%.2000s", module)
	}
	var plan map[string]any
	if err := json.Unmarshal([]byte(m[1]), &plan); err != nil {
		t.Fatal(err)
	}
	return plan
}

// TestExportTimePlan exports a plan priced in time, from the model's
// flags and from the saved plan: both write its schedule — every layer's
// decision and keep set, and so its peak, which bytes decide and no
// unit changes — priced in FLOPs. The time plan's keep sets are not all
// on the FLOPs front: the export makes them from what they keep.
func TestExportTimePlan(t *testing.T) {
	flags := []string{"llama-3-8b", "--device", "h100-80gb", "--seq", "8192", "--batch", "2", "--lora-rank", "16", "--objective", "time"}
	out, stderr, err := runCmd(append([]string{"plan", "--format", "json"}, flags...)...)
	if err != nil {
		t.Fatal(err, stderr)
	}
	var plan struct {
		Unit      string  `json:"unit"`
		PeakBytes float64 `json:"peak_bytes"`
		Stages    []struct {
			Name, Decision, Option string
		} `json:"stages"`
	}
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatal(err)
	}
	if plan.Unit != "ps" {
		t.Fatalf("unit %q", plan.Unit)
	}
	path := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
		t.Fatal(err)
	}
	fromFlags, stderr, err := runCmd(append(append([]string{"export"}, flags...), "--to", "pytorch")...)
	if err != nil {
		t.Fatal(err, stderr)
	}
	fromFile, stderr, err := runCmd("export", path, "--to", "pytorch")
	if err != nil {
		t.Fatal(err, stderr)
	}
	a, b := exportedPlan(t, fromFlags), exportedPlan(t, fromFile)
	if d := cmp.Diff(a, b); d != "" {
		t.Errorf("the export from the flags and from the saved plan differ (-flags +file):\n%s", d)
	}
	if got := a["peak_bytes"].(float64); got != plan.PeakBytes {
		t.Errorf("exported peak %v, the time plan's %v", got, plan.PeakBytes)
	}
	layers := map[string]map[string]any{}
	for _, l := range a["layers"].([]any) {
		l := l.(map[string]any)
		layers[l["name"].(string)] = l
	}
	selective := 0
	for _, st := range plan.Stages {
		l, ok := layers[st.Name]
		if !ok {
			continue
		}
		if l["mode"] != st.Decision {
			t.Errorf("%s: exported %v, the plan %s", st.Name, l["mode"], st.Decision)
		}
		if st.Decision == "selective" {
			selective++
			if l["policy"] != st.Option {
				t.Errorf("%s: exported keep set %v, the plan's %s", st.Name, l["policy"], st.Option)
			}
			if f, _ := l["recompute_flops"].(float64); !(f > 0) {
				t.Errorf("%s: recompute_flops %v", st.Name, l["recompute_flops"])
			}
		}
	}
	if selective == 0 {
		t.Fatal("the time plan has no selective layer: the test checks nothing of keep sets")
	}
}

// TestDefaultObjective: a plan is priced in time where the device's
// figures are known (a named GPU, or --roofline), a pipeline's too, in
// FLOPs for a bare budget, a device known by its memory, and --objective
// flops.
func TestDefaultObjective(t *testing.T) {
	roofline := "matrix=1e12,bandwidth=1e11"
	for _, tc := range []struct {
		args []string
		unit string
	}{
		{[]string{"--device", "h100-80gb"}, "ps"},
		{[]string{"--device", "rtx-4090", "--seq", "512", "--budget", "23GiB"}, "ps"},
		{[]string{"--budget", "60GiB", "--roofline", roofline}, "ps"},
		{[]string{"--budget", "60GiB"}, "FLOPs"},
		{[]string{"--device", "80GiB"}, "FLOPs"},
		{[]string{"--device", "h100-80gb", "--objective", "flops"}, "FLOPs"},
		{[]string{"--device", "h100-80gb", "--pp", "2"}, "ps"},
		{[]string{"--device", "h100-80gb", "--pp", "2", "--objective", "flops"}, "FLOPs"},
		{[]string{"--budget", "60GiB", "--pp", "2", "--roofline", roofline}, "ps"},
		{[]string{"--device", "h100-80gb", "--pp", "2", "--objective", "time"}, "ps"},
	} {
		var stdout, stderr bytes.Buffer
		args := append([]string{"plan", "llama-3-8b", "--lora-rank", "16", "--seq", "2048", "--format", "json"}, tc.args...)
		if err := run(&stdout, &stderr, args); err != nil {
			t.Fatalf("%v: %v\n%s", tc.args, err, stderr.String())
		}
		var plan struct{ Unit string }
		if err := json.Unmarshal(stdout.Bytes(), &plan); err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if plan.Unit != tc.unit {
			t.Errorf("%v: unit %q, want %q", tc.args, plan.Unit, tc.unit)
		}
	}
}
