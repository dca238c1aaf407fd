package planner

import (
	"encoding/json"
	"testing"
)

// TestDecisionSet: Set takes every decision Decisions lists and refuses
// another, naming them.
func TestDecisionSet(t *testing.T) {
	want := []string{"store", "selective", "checkpoint", "recompute"}
	got := Decisions()
	if len(got) != len(want) {
		t.Fatalf("Decisions() = %v, want %v", got, want)
	}
	for i, v := range want {
		var d Decision
		if err := d.Set(v); err != nil || d != got[i] || d.String() != v {
			t.Errorf("Set(%q): %q, %v; want %q", v, d, err, got[i])
		}
	}
	d := DecisionStore
	const msg = `unknown value "keep" (valid: store, selective, checkpoint, recompute)`
	if err := d.Set("keep"); err == nil || err.Error() != msg || d != DecisionStore {
		t.Errorf("Set(%q): %q, %v; want %s, the value unchanged", "keep", d, err, msg)
	}
}

// TestDecisionEncoding: a stage's decision is a plain string in a plan.
func TestDecisionEncoding(t *testing.T) {
	data, err := json.Marshal(Stage{Name: "layers.0", Decision: DecisionSelective, Option: "keep(x)"})
	if err != nil {
		t.Fatal(err)
	}
	const want = `{"index":0,"name":"layers.0","forward":0,"backward":0,"input_bytes":0,"saved_bytes":0,"decision":"selective","option":"keep(x)"}`
	if string(data) != want {
		t.Errorf("got %s\nwant %s", data, want)
	}
	var back Stage
	if err := json.Unmarshal(data, &back); err != nil || back.Decision != DecisionSelective {
		t.Errorf("decoded %q, %v", back.Decision, err)
	}
}
