package export

import "testing"

// TestModeSet: Set takes every mode Modes lists and refuses another,
// naming them.
func TestModeSet(t *testing.T) {
	want := []string{"store", "checkpoint", "selective"}
	got := Modes()
	if len(got) != len(want) {
		t.Fatalf("Modes() = %v, want %v", got, want)
	}
	for i, v := range want {
		var m Mode
		if err := m.Set(v); err != nil || m != got[i] || m.String() != v {
			t.Errorf("Set(%q): %q, %v; want %q", v, m, err, got[i])
		}
	}
	m := ModeCheckpoint
	const msg = `unknown value "recompute" (valid: store, checkpoint, selective)`
	if err := m.Set("recompute"); err == nil || err.Error() != msg || m != ModeCheckpoint {
		t.Errorf("Set(%q): %q, %v; want %s, the value unchanged", "recompute", m, err, msg)
	}
}
