package solver_test

import (
	"fmt"

	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// Three stages of cost 1 forward and 2 backward, 1-byte activations and
// 3-byte tapes. Storing every tape needs 11 bytes (a_0, three tapes, and
// δ_3 next to the tape holding a_3); with less, the optimal schedule
// recomputes one stage, then two.
func ExampleNewTable() {
	c := &solver.Chain{
		Forward:           []float64{1, 1, 1},
		Backward:          []float64{2, 2, 2},
		ActBytes:          []mem.Bytes{1, 1, 1, 1},
		TapeBytes:         []mem.Bytes{3, 3, 3},
		ForwardTempBytes:  []mem.Bytes{0, 0, 0},
		BackwardTempBytes: []mem.Bytes{0, 0, 0},
	}
	t, err := solver.NewTable(c, 11, 11)
	if err != nil {
		panic(err)
	}
	for _, budget := range []mem.Bytes{11, 10, 8, 6, 5} {
		s, err := t.Schedule(budget)
		if err != nil {
			fmt.Printf("%d %v\n", budget, err)
			continue
		}
		r, _ := solver.Simulate(c, s)
		fmt.Printf("%d %g %d %v\n", budget, r.Cost, r.Peak, s)
	}
	// Output:
	// 11 9 11 [F_all(0) F_all(1) F_all(2) loss(3) B(2) B(1) B(0)]
	// 10 10 9 [F_all(0) F_ck(1) F_all(2) loss(3) B(2) F_all(1) B(1) B(0)]
	// 8 11 7 [F_ck(0) F_ck(1) F_all(2) loss(3) B(2) F_all(1) B(1) F_all(0) B(0)]
	// 6 12 6 [F_ck(0) F_n(1) F_all(2) loss(3) B(2) F_ck(0) F_all(1) B(1) F_all(0) B(0)]
	// 5 budget of 5 bytes is too small
}
