package planner

import "testing"

// TestCommExposed checks what a step's collectives add to it: what
// exceeds a micro-batch's forward and backward, or its reductions what
// exceeds its backward, then the gather after the step.
func TestCommExposed(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		c                     *Comm
		micro, backward, want float64
		m                     int64
	}{
		{"none", nil, 10, 6, 0, 2},
		{"hidden", &Comm{Gather: 3, Reduce: 5}, 10, 6, 0, 3},
		{"reduce past the backward", &Comm{Reduce: 8}, 10, 6, 3 * 2, 3},
		{"all past the micro-batch", &Comm{Gather: 8, Reduce: 5}, 10, 6, 3 * 3, 3},
		{"once a step", &Comm{Reduce: 8, OnceAStep: true}, 10, 6, 2, 3},
		{"once a step, gathers every time", &Comm{Gather: 12, Reduce: 8, OnceAStep: true}, 10, 6, 2*2 + 10, 3},
		{"after the step", &Comm{Reduce: 4, AfterStep: 7}, 10, 6, 7, 2},
		// Megatron-LM's: the reduction hides behind no backward.
		{"after the backward", &Comm{Reduce: 4, OnceAStep: true, AfterBackward: true}, 10, 6, 4, 3},
		{"after the backward and the step", &Comm{Reduce: 4, AfterStep: 7, OnceAStep: true, AfterBackward: true}, 10, 6, 4 + 7, 3},
	} {
		if got := tc.c.Exposed(tc.micro, tc.backward, tc.m); got != tc.want {
			t.Errorf("%s: Exposed = %g, want %g", tc.name, got, tc.want)
		}
	}
}

// TestOptionsResolveOnce: options resolved once come back as they are, so
// that a device's plan asked for with no reserve keeps none when a caller
// (fit, its probes) resolves them again.
func TestOptionsResolveOnce(t *testing.T) {
	o := &Options{Device: "h100-80gb", Budget: 6 << 20, Reserve: NoReserve}
	once, err := o.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	twice, err := once.withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if once.Reserve != 0 || twice.Reserve != 0 || twice.Budget != 6<<20 {
		t.Errorf("reserve %v, then %v (budget %v), want none both times", once.Reserve, twice.Reserve, twice.Budget)
	}
	dflt, err := (&Options{Device: "h100-80gb"}).withDefaults()
	if err != nil {
		t.Fatal(err)
	}
	if dflt.Reserve == 0 {
		t.Error("the device's default reserve is gone")
	}
}
