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

	"github.com/ckptplan/ckptplan/mem"
)

// DefaultSlots is the slot count used when none is given.
const DefaultSlots = 1000

// Table is a filled dynamic-programming table for one chain and every budget
// up to a maximum.
type Table struct {
	c       *Chain
	l       int       // stages; the loss is index l
	unit    mem.Bytes // bytes per slot
	slots   int       // S: columns are m = 0..S
	maxBud  mem.Bytes
	act     []int // a_0 … a_{L+1} in slots (a_{L+1} = 0)
	opts    [][]slotOption
	ftmp    []int // F_ck, F_n
	fw      []float64
	sumFw   []float64
	lossTmp int
	lossBw  float64
	cost    []float64 // C, row (a, b) at rowOf(a, b)
	// choice: j > 0 checkpoint a_j; −1−2q chain with option q; −2−2q a
	// leaf with option q (the loss: −2).
	choice  []int16
	rowSize int
}

// slotOption is an option of a storing forward in slots; k is its index
// in the chain.
type slotOption struct {
	tape, fatmp, btmp int
	bw                float64
	k                 int
}

// MaxTableBytes bounds the memory of one table, checked before it is
// allocated.
const MaxTableBytes = 4 * mem.GiB

// TableBytes returns the memory of the table of l stages at the given
// slots: a cost (8 bytes) and a choice (2 bytes) for every pair of stages
// a ≤ b, the loss included, and every slot count 0…slots (MaxInt64 when
// that overflows).
func TableBytes(l, slots int) mem.Bytes {
	rows := mem.Bytes(l+1) * mem.Bytes(l+2) / 2
	if mem.Bytes(slots+1) > math.MaxInt64/(10*rows) {
		return math.MaxInt64 // saturated: far past any limit
	}
	return rows * mem.Bytes(slots+1) * 10
}

// maxOptions bounds the options kept per stage, so that choices fit in
// an int16.
const maxOptions = 4096

// NewTable fills the table for budgets up to maxBudget bytes (the whole
// memory, a_0 included) with the given number of slots (DefaultSlots if
// slots ≤ 0). O(slots·L·(L² + V)) time for V options per stage.
func NewTable(c *Chain, maxBudget mem.Bytes, slots int) (*Table, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if maxBudget <= 0 {
		return nil, &ErrInfeasible{Budget: maxBudget}
	}
	if slots <= 0 {
		slots = DefaultSlots
	}
	if mem.Bytes(slots) > maxBudget {
		slots = int(maxBudget)
	}
	if need := TableBytes(c.Len(), slots); need > MaxTableBytes {
		return nil, fmt.Errorf("the optimal table of %d stages at %d slots would take %v, more than the %v ckptplan allows: use fewer slots", c.Len(), slots, need, MaxTableBytes)
	}
	t := &Table{c: c, l: c.Len(), slots: slots, maxBud: maxBudget}
	t.unit = (maxBudget + mem.Bytes(slots) - 1) / mem.Bytes(slots)
	if err := t.prepare(); err != nil {
		return nil, err
	}
	t.fill()
	return t, nil
}

func (t *Table) toSlots(b mem.Bytes) int {
	s := (b + t.unit - 1) / t.unit
	if s > mem.Bytes(t.slots)+1 {
		return t.slots + 1 // larger than any budget: never fits
	}
	return int(s)
}

func (t *Table) prepare() error {
	c, l := t.c, t.l
	t.act = make([]int, l+2)
	for i, x := range c.ActBytes {
		t.act[i] = t.toSlots(x)
	}
	t.ftmp, t.fw, t.sumFw = make([]int, l), make([]float64, l), make([]float64, l+1)
	t.opts = make([][]slotOption, l)
	for i := 0; i < l; i++ {
		t.ftmp[i] = t.toSlots(c.ForwardTempBytes[i])
		t.fw[i] = c.Forward[i]
		t.sumFw[i+1] = t.sumFw[i] + t.fw[i]
		t.opts[i] = t.stageOptions(i)
		if len(t.opts[i]) > maxOptions {
			return fmt.Errorf("stage %d has %d options that no other option dominates; at most %d are supported", i, len(t.opts[i]), maxOptions)
		}
	}
	t.lossTmp, t.lossBw = t.toSlots(c.LossTempBytes), c.LossBackward
	t.rowSize = t.slots + 1
	rows := (l + 1) * (l + 2) / 2
	t.cost = make([]float64, rows*t.rowSize)
	t.choice = make([]int16, rows*t.rowSize)
	return nil
}

// stageOptions returns the options of stage i in slots, without those
// another option dominates: one with no larger tape, no larger peak
// during F_all or B, and no larger backward cost is never worse in the
// recurrence, since C is nonincreasing in m. O(V²).
func (t *Table) stageOptions(i int) []slotOption {
	n := t.c.NumOptions(i)
	all := make([]slotOption, n)
	for k := range all {
		o := t.c.Option(i, k)
		all[k] = slotOption{t.toSlots(o.TapeBytes), t.toSlots(o.FAllTempBytes), t.toSlots(o.BackwardTempBytes), o.Backward, k}
	}
	dominates := func(q, p slotOption) bool {
		return q.tape <= p.tape && q.tape+q.fatmp <= p.tape+p.fatmp && q.tape+q.btmp <= p.tape+p.btmp && q.bw <= p.bw
	}
	var out []slotOption
	for k, p := range all {
		dominated := false
		for j, q := range all {
			if j != k && dominates(q, p) && (j < k || !dominates(p, q)) {
				dominated = true
				break
			}
		}
		if !dominated {
			out = append(out, p)
		}
	}
	return out
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
			for q := range t.opts[a] {
				t.fillChain(a, b, q, cost, choice)
			}
			t.fillCheckpoints(a, b, cost, choice)
		}
	}
}

// fillLeaf: C(a, a, m) is F_all(a) then B(a) with δ_{a+1} live, under
// the cheapest option that fits, or the loss alone.
func (t *Table) fillLeaf(a int, cost []float64, choice []int16) {
	if a == t.l {
		for m := t.lossTmp; m <= t.slots; m++ {
			cost[m], choice[m] = t.lossBw, -2
		}
		return
	}
	for q, o := range t.opts[a] {
		v := t.fw[a] + o.bw
		for m := t.act[a+1] + o.tape + max(o.fatmp, o.btmp); m <= t.slots; m++ {
			if v < cost[m] {
				cost[m], choice[m] = v, int16(-2-2*q)
			}
		}
	}
}

// fillChain: F_all(a) under option q with δ_{b+1} live, the rest with
// ā_{a+1} kept, then B(a) with δ_{a+1} live.
func (t *Table) fillChain(a, b, q int, cost []float64, choice []int16) {
	if a == t.l {
		return
	}
	o := t.opts[a][q]
	tape := o.tape
	lo := max(t.act[b+1]+tape+o.fatmp, t.act[a+1]+tape+o.btmp, tape)
	if lo > t.slots {
		return
	}
	n := t.slots + 1 - lo
	sub := t.cost[t.rowOf(a+1, b)+lo-tape:][:n]
	cs, ch := cost[lo:][:n], choice[lo:][:n]
	base := t.fw[a] + o.bw
	code := int16(-1 - 2*q)
	for k, c := range sub {
		if v := base + c; v < cs[k] {
			cs[k], ch[k] = v, code
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
func (t *Table) budgetSlots(budget mem.Bytes) int {
	if budget > t.maxBud {
		budget = t.maxBud
	}
	return int(budget/t.unit) - t.act[0]
}

// Cost returns the optimal cost for a budget up to the table's maximum, or
// +Inf when no schedule fits. O(1).
func (t *Table) Cost(budget mem.Bytes) float64 {
	m := t.budgetSlots(budget)
	if m < 0 {
		return math.Inf(1)
	}
	return t.cost[t.rowOf(0, t.l)+m]
}

// MinBudget returns the least budget at which the table finds a schedule,
// or MaxInt64 when it finds none. O(slots).
func (t *Table) MinBudget() mem.Bytes {
	row := t.cost[t.rowOf(0, t.l):][:t.rowSize]
	for m, c := range row {
		if !math.IsInf(c, 1) {
			return mem.Bytes(m+t.act[0]) * t.unit
		}
	}
	return math.MaxInt64
}

// Unit returns the bytes of one slot.
func (t *Table) Unit() mem.Bytes { return t.unit }

// Schedule returns the optimal schedule for a budget up to the table's
// maximum, or an *ErrInfeasible. O(length of the schedule).
func (t *Table) Schedule(budget mem.Bytes) (Schedule, error) {
	m := t.budgetSlots(budget)
	if m < 0 || math.IsInf(t.cost[t.rowOf(0, t.l)+m], 1) {
		return nil, &ErrInfeasible{Budget: budget}
	}
	var s Schedule
	t.emit(&s, 0, t.l, m)
	return s, nil
}

func (t *Table) emit(s *Schedule, a, b, m int) {
	j := int(t.choice[t.rowOf(a, b)+m])
	if j > 0 {
		*s = append(*s, Op{Kind: FCk, Stage: a})
		for k := a + 1; k < j; k++ {
			*s = append(*s, Op{Kind: FN, Stage: k})
		}
		t.emit(s, j, b, m-t.act[j])
		t.emit(s, a, j-1, m)
		return
	}
	x := -j - 1
	if a == t.l {
		*s = append(*s, Op{Kind: Loss, Stage: t.l})
		return
	}
	o := t.opts[a][x/2]
	*s = append(*s, Op{Kind: FAll, Stage: a, Option: o.k})
	if x%2 == 0 { // chain
		t.emit(s, a+1, b, m-o.tape)
	}
	*s = append(*s, Op{Kind: B, Stage: a})
}
