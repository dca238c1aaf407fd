package solver

// The optimal persistent schedule (Beaumont, Eyraud-Dubois, Herrmann, Joly,
// Shilova, "Optimal checkpointing for heterogeneous chains", INRIA RR-9302,
// 2019; the "rotor" library).
//
// Let C(a, b, m) be the least cost of computing δ_a from δ_{b+1} given a_a,
// with m bytes available besides a_a (δ_{b+1} counts against m). The loss
// is stage L, with no forward, a tape of 0 bytes and an output of 0 bytes.
// Two choices end the recursion's first step:
//
//	chain:      F_all(a), then C(a+1, b, m − |ā_{a+1}|), then B(a)
//	checkpoint: F_ck(a), F_n(a+1) … F_n(j−1), keeping a_a; then
//	            C(j, b, m − |a_j|), then C(a, j−1, m)        (a < j ≤ b)
//
//	C(a, b, m) = min( fw_a + bw_a + C(a+1, b, m − |ā_{a+1}|),
//	                  min_j Σ_{k=a}^{j−1} fw_k + C(j, b, m − |a_j|) + C(a, j−1, m) )
//
// each option allowed only when the peaks of its own ops fit in m: F_all(a)
// with δ_{b+1} live, B(a) with δ_{a+1} and ā_{a+1} live, every F_n(k) with
// its input, output and δ_{b+1} live. C(a, a, m) = fw_a + bw_a when F_all(a)
// and B(a) fit, with δ_{a+1} live. These conditions are exactly Simulate's
// accounting, so a schedule the table deems feasible replays within its
// budget, and the table's cost is the replayed cost.
//
// Sizes are measured in slots of u = ⌈M/S⌉ bytes, rounded up, so that the
// table has S+1 columns; with u = 1 nothing is rounded. The table is filled
// by increasing b − a; for each (a, b) and j the inner loop over m reads two
// contiguous rows, so it runs without allocation or branches the compiler
// cannot hoist. Time O(S·L³), space O(S·L²); one table answers every budget
// up to M, which gives the whole memory/cost curve in one solve.
//
// A tiny example (ExampleNewTable): three stages costing 1 forward and 2
// backward, 1-byte activations, 3-byte tapes. Storing every tape peaks at
// 11 bytes and costs 9; at 10 bytes the table keeps a_2 as a checkpoint and
// recomputes stage 1 (cost 10); at 8, stages 0 and 1 (cost 11); at 6 it
// recomputes from a_0 twice (cost 12); 5 bytes admit no schedule.

import (
	"fmt"
	"math"
)

// DefaultSlots is the slot count used when none is given.
const DefaultSlots = 500

// Table is a filled dynamic-programming table for one chain and every budget
// up to a maximum.
type Table struct {
	c       *Chain
	l       int   // stages; the loss is index l
	unit    int64 // bytes per slot
	slots   int   // S: columns are m = 0..S
	maxBud  int64
	act     []int // a_0 … a_{L+1} in slots (a_{L+1} = 0)
	tape    []int // ā of stage 0 … L in slots (the loss: 0)
	ftmp    []int // F_ck, F_n
	fatmp   []int // F_all
	btmp    []int
	fw, bw  []float64
	sumFw   []float64
	cost    []float64 // C, row (a, b) at rowOf(a, b)
	choice  []int16   // -1 chain, -2 leaf, j: checkpoint a_j
	rowSize int
}

// NewTable fills the table for budgets up to maxBudget bytes (the whole
// memory, a_0 included) with the given number of slots (DefaultSlots if
// slots ≤ 0). O(slots·L³) time.
func NewTable(c *Chain, maxBudget int64, slots int) (*Table, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if maxBudget <= 0 {
		return nil, &ErrInfeasible{Budget: maxBudget}
	}
	if slots <= 0 {
		slots = DefaultSlots
	}
	if int64(slots) > maxBudget {
		slots = int(maxBudget)
	}
	if c.Len() >= math.MaxInt16 {
		return nil, fmt.Errorf("chain of %d stages is too long", c.Len())
	}
	t := &Table{c: c, l: c.Len(), slots: slots, maxBud: maxBudget}
	t.unit = (maxBudget + int64(slots) - 1) / int64(slots)
	t.prepare()
	t.fill()
	return t, nil
}

func (t *Table) toSlots(b int64) int {
	s := (b + t.unit - 1) / t.unit
	if s > int64(t.slots)+1 {
		return t.slots + 1 // larger than any budget: never fits
	}
	return int(s)
}

func (t *Table) prepare() {
	c, l := t.c, t.l
	t.act = make([]int, l+2)
	for i, x := range c.ActBytes {
		t.act[i] = t.toSlots(x)
	}
	t.tape, t.ftmp, t.fatmp, t.btmp = make([]int, l+1), make([]int, l+1), make([]int, l+1), make([]int, l+1)
	t.fw, t.bw, t.sumFw = make([]float64, l+1), make([]float64, l+1), make([]float64, l+2)
	for i := 0; i < l; i++ {
		t.tape[i] = t.toSlots(c.TapeBytes[i])
		t.ftmp[i] = t.toSlots(c.ForwardTempBytes[i])
		t.fatmp[i] = t.toSlots(c.FAllTemp(i))
		t.btmp[i] = t.toSlots(c.BackwardTempBytes[i])
		t.fw[i], t.bw[i] = c.Forward[i], c.Backward[i]
	}
	t.btmp[l] = t.toSlots(c.LossTempBytes)
	t.bw[l] = c.LossBackward
	for i := 0; i <= l; i++ {
		t.sumFw[i+1] = t.sumFw[i] + t.fw[i]
	}
	t.rowSize = t.slots + 1
	rows := (l + 1) * (l + 2) / 2
	t.cost = make([]float64, rows*t.rowSize)
	t.choice = make([]int16, rows*t.rowSize)
}

// rowOf returns the offset of row (a, b), a ≤ b ≤ L, in the triangular
// layout.
func (t *Table) rowOf(a, b int) int {
	n := t.l + 1
	return (a*(2*n-a+1)/2 + (b - a)) * t.rowSize
}

func (t *Table) fill() {
	inf := math.Inf(1)
	for d := 0; d <= t.l; d++ {
		for a := 0; a+d <= t.l; a++ {
			b := a + d
			row := t.rowOf(a, b)
			cost := t.cost[row : row+t.rowSize]
			choice := t.choice[row : row+t.rowSize]
			for m := range cost {
				cost[m] = inf
			}
			if d == 0 {
				t.fillLeaf(a, cost, choice)
				continue
			}
			t.fillChain(a, b, cost, choice)
			t.fillCheckpoints(a, b, cost, choice)
		}
	}
}

// fillLeaf: C(a, a, m) is F_all(a) then B(a) with δ_{a+1} live, or the
// loss alone.
func (t *Table) fillLeaf(a int, cost []float64, choice []int16) {
	need := t.btmp[a] + t.act[a+1]
	if a < t.l {
		need = t.act[a+1] + t.tape[a] + max(t.fatmp[a], t.btmp[a])
	}
	v := t.fw[a] + t.bw[a]
	for m := need; m <= t.slots; m++ {
		cost[m], choice[m] = v, -2
	}
}

// fillChain: F_all(a) with δ_{b+1} live, the rest with ā_{a+1} kept, then
// B(a) with δ_{a+1} live.
func (t *Table) fillChain(a, b int, cost []float64, choice []int16) {
	if a == t.l {
		return
	}
	tape := t.tape[a]
	lo := max(t.act[b+1]+tape+t.fatmp[a], t.act[a+1]+tape+t.btmp[a], tape)
	if lo > t.slots {
		return
	}
	n := t.slots + 1 - lo
	sub := t.cost[t.rowOf(a+1, b)+lo-tape:][:n]
	cs, ch := cost[lo:][:n], choice[lo:][:n]
	base := t.fw[a] + t.bw[a]
	for k, c := range sub {
		if v := base + c; v < cs[k] {
			cs[k], ch[k] = v, -1
		}
	}
}

// fillCheckpoints: forward from a_a (kept) to a_j without tapes, then the
// right part with a_j kept, then the left part.
func (t *Table) fillCheckpoints(a, b int, cost []float64, choice []int16) {
	need := t.act[b+1] + t.act[a+1] + t.ftmp[a] // F_ck(a)
	for j := a + 1; j <= b; j++ {
		if j > a+1 {
			k := j - 1 // F_n(k) with a_k, a_{k+1} and δ_{b+1} live
			need = max(need, t.act[b+1]+t.act[k]+t.act[k+1]+t.ftmp[k])
		}
		aj := t.act[j]
		lo := max(need, aj)
		if lo > t.slots {
			continue
		}
		n := t.slots + 1 - lo
		right := t.cost[t.rowOf(j, b)+lo-aj:][:n]
		left := t.cost[t.rowOf(a, j-1)+lo:][:n]
		cs, ch := cost[lo:][:n], choice[lo:][:n]
		base := t.sumFw[j] - t.sumFw[a]
		for k := range cs {
			if v := base + right[k] + left[k]; v < cs[k] {
				cs[k], ch[k] = v, int16(j)
			}
		}
	}
}

// budgetSlots returns the slots left besides a_0 for a budget in bytes.
func (t *Table) budgetSlots(budget int64) int {
	if budget > t.maxBud {
		budget = t.maxBud
	}
	return int(budget/t.unit) - t.act[0]
}

// Cost returns the optimal cost for a budget up to the table's maximum, or
// +Inf when no schedule fits. O(1).
func (t *Table) Cost(budget int64) float64 {
	m := t.budgetSlots(budget)
	if m < 0 {
		return math.Inf(1)
	}
	return t.cost[t.rowOf(0, t.l)+m]
}

// Unit returns the bytes of one slot.
func (t *Table) Unit() int64 { return t.unit }

// Schedule returns the optimal schedule for a budget up to the table's
// maximum, or an *ErrInfeasible. O(length of the schedule).
func (t *Table) Schedule(budget int64) (Schedule, error) {
	m := t.budgetSlots(budget)
	if m < 0 || math.IsInf(t.cost[t.rowOf(0, t.l)+m], 1) {
		return nil, &ErrInfeasible{Budget: budget}
	}
	var s Schedule
	t.emit(&s, 0, t.l, m)
	return s, nil
}

func (t *Table) emit(s *Schedule, a, b, m int) {
	switch j := int(t.choice[t.rowOf(a, b)+m]); {
	case j == -2 && a == t.l:
		*s = append(*s, Op{Loss, t.l})
	case j == -2:
		*s = append(*s, Op{FAll, a}, Op{B, a})
	case j == -1:
		*s = append(*s, Op{FAll, a})
		t.emit(s, a+1, b, m-t.tape[a])
		*s = append(*s, Op{B, a})
	default:
		*s = append(*s, Op{FCk, a})
		for k := a + 1; k < j; k++ {
			*s = append(*s, Op{FN, k})
		}
		t.emit(s, j, b, m-t.act[j])
		t.emit(s, a, j-1, m)
	}
}
