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
	} {
		if got := tc.c.Exposed(tc.micro, tc.backward, tc.m); got != tc.want {
			t.Errorf("%s: Exposed = %g, want %g", tc.name, got, tc.want)
		}
	}
}
