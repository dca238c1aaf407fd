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
// Parameter gradients (Chain.GradBytes) change none of this: B(L−1) …
// B(0) run in that order, so the gradients made so far are live exactly
// while the one gradient δ_i is, and counting them in |δ_i|
// (Chain.DeltaBytes) counts them wherever they are live.
//
// Sizes are measured in slots of u = ⌈M/S⌉ bytes, rounded up, so that the
// table has S+1 columns; with u = 1 nothing is rounded. Time O(S·L³),
// space O(S·L²); one table answers every budget up to M, which gives the
// whole memory/cost curve in one solve. The table holds costs only: a
// schedule is read back by finding, at each visited entry, the choice
// whose cost the entry holds (choose), which costs O(L) an entry visited
// instead of a byte or two of every entry of the table. fill.go says how
// the table is filled.
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
	c      *Chain
	l      int       // stages; the loss is index l
	unit   mem.Bytes // bytes per slot
	slots  int       // S: columns are m = 0..S
	maxBud mem.Bytes
	act    []int // a_0 … a_{L+1} in slots (a_{L+1} = 0)
	// held is what every budget holds besides the table's columns: a_0,
	// the model's call arguments (Chain.ArgBytes) and the embeddings its
	// forward holds (Chain.Embeds), counted live the whole step, in slots.
	held    int
	dlt     []int // δ_0 … δ_{L+1} in slots, the parameter gradients they carry included (Chain.DeltaBytes)
	opts    [][]slotOption
	ftmp    []int // F_ck, F_n
	fw      []float64
	sumFw   []float64
	lossTmp int
	lossBw  float64
	// cost holds D(a, b, m) = C(a, b, m) + S_a (fill.go) block by block:
	// block k holds the blockCols columns k·blockCols … of the entries
	// not yet flat there, (a, first_k(a)) … (a, L) for each a, side by
	// side; columns past S hold +Inf.
	cost    []float64
	lastCol int // the last column filled: S, or less (newTable)
	blocks  int // blocks of columns 0 … lastCol
	// first[k·(L+1)+a] is first_k(a), and start[k·(L+1)+a] the offset in
	// blocks of (a, first_k(a)) in cost.
	first      []int32
	start      []int
	keptBlocks int // the blocks in cost
	// floor[entry(a, b)] is the cost of storing every tape from a to b with
	// each stage's cheapest backward, and flatAt the least m from which
	// D(a, b, m) is that floor (S+1: nowhere); flatAt grows with b.
	floor  []float64
	flatAt []int32
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

// TableBytes returns the most memory the table of l stages at the given
// slots takes: a cost (8 bytes) for every pair of stages a ≤ b, the loss
// included, and every slot count 0…slots rounded up to a block, and 12
// bytes of bounds per pair (MaxInt64 when that overflows). The table
// keeps only the columns below each pair's floor (fill.go), often a third
// of that.
func TableBytes(l, slots int) mem.Bytes {
	rows := mem.Bytes(l+1) * mem.Bytes(l+2) / 2
	cols := (mem.Bytes(slots) + blockCols) / blockCols * blockCols
	if cols+2 > math.MaxInt64/(8*rows) {
		return math.MaxInt64 // saturated: far past any limit
	}
	return rows * (cols*8 + 12)
}

// maxOptions bounds the options kept per stage.
const maxOptions = 4096

// NewTable fills the table for budgets up to maxBudget bytes (the whole
// memory, a_0 included) with the given number of slots (DefaultSlots if
// slots ≤ 0). O(slots·L·(L² + V)) time for V options per stage.
func NewTable(c *Chain, maxBudget mem.Bytes, slots int) (*Table, error) {
	return newTable(c, maxBudget, slots, maxBudget)
}

// newTable is NewTable filling only the columns of budgets up to upTo: the
// same grid, and the same costs there, for a fraction of the work; Cost,
// MinBudget and Schedule see no further.
func newTable(c *Chain, maxBudget mem.Bytes, slots int, upTo mem.Bytes) (*Table, error) {
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
	rows := mem.Bytes(c.Len()+1) * mem.Bytes(c.Len()+2) / 2
	if rows*12 > MaxTableBytes || TableBytes(c.Len(), 0) > MaxTableBytes {
		return nil, fmt.Errorf("the optimal table of %d stages would take more than the %v ckptplan allows", c.Len(), MaxTableBytes)
	}
	t := &Table{c: c, l: c.Len(), slots: slots, maxBud: maxBudget}
	t.unit = (maxBudget + mem.Bytes(slots) - 1) / mem.Bytes(slots)
	if err := t.prepare(); err != nil {
		return nil, err
	}
	t.lastCol = t.slots
	if upTo < maxBudget {
		t.lastCol = min(max(int(upTo/t.unit)-t.held, 0), t.slots)
	}
	t.blocks = t.lastCol/blockCols + 1
	// The layout's own index, two words a block of each first stage,
	// comes before the table it measures.
	if mem.Bytes(t.blocks) > MaxTableBytes/(12*mem.Bytes(t.l+1)) {
		return nil, fmt.Errorf("the optimal table of %d stages at %d slots would take more than the %v ckptplan allows: use fewer slots", c.Len(), slots, MaxTableBytes)
	}
	t.bounds()
	if need := t.layout(); need > MaxTableBytes {
		return nil, fmt.Errorf("the optimal table of %d stages at %d slots would take %v, more than the %v ckptplan allows: use fewer slots", c.Len(), slots, need, MaxTableBytes)
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
	t.act, t.dlt = make([]int, l+2), make([]int, l+2)
	for i, x := range c.ActBytes {
		t.act[i] = t.toSlots(x)
	}
	for i, d := range c.deltas() {
		t.dlt[i] = t.toSlots(d)
	}
	t.held = t.toSlots(c.ActBytes[0] + c.ArgBytes + c.Embeds.Bytes)
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
	return nil
}

// stageOptions returns the options of stage i in slots, without those
// another option dominates: one with no larger tape, no larger peak
// during F_all or B, and no larger backward cost is never worse in the
// recurrence, since C is nonincreasing in m. Named options are left
// out. O(V²).
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
		if t.c.Option(i, k).Named {
			continue
		}
		dominated := false
		for j, q := range all {
			if j != k && !t.c.Option(i, j).Named && dominates(q, p) && (j < k || !dominates(p, q)) {
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

// entry returns the index of the pair (a, b), a ≤ b ≤ L: pairs are
// ordered by a, then b, so that (a, b) and (a, b+1) are neighbours.
func (t *Table) entry(a, b int) int {
	n := t.l + 1
	return a*(2*n-a+1)/2 + (b - a)
}

// layout places every block of every entry not yet flat in it and
// returns the table's memory, without allocating it.
func (t *Table) layout() mem.Bytes {
	n := t.l + 1
	t.first = make([]int32, t.blocks*n)
	t.start = make([]int, t.blocks*n)
	next := 0
	for k := range t.blocks {
		for a := range n {
			b := a
			if k > 0 { // flat in block k−1, flat in block k
				b = int(t.first[(k-1)*n+a])
			}
			for b < n && int(t.flatAt[t.entry(a, b)]) <= k*blockCols {
				b++
			}
			t.first[k*n+a], t.start[k*n+a] = int32(b), next
			next += n - b
		}
	}
	t.keptBlocks = next
	// The costs, the floors and flatAt, and the fill's spans (fill.go).
	return mem.Bytes(next)*blockCols*8 + mem.Bytes(len(t.floor))*12 + mem.Bytes(t.l)*mem.Bytes(t.l+1)*8
}

// kept reports whether block k of entry (a, b) is in the table.
func (t *Table) kept(a, b, k int) bool { return b >= int(t.first[k*(t.l+1)+a]) }

// seg returns block k of D(a, b, ·), which must be kept.
func (t *Table) seg(a, b, k int) *[blockCols]float64 {
	i := k*(t.l+1) + a
	return (*[blockCols]float64)(t.cost[(t.start[i]+b-int(t.first[i]))*blockCols:])
}

// read returns block k of D(a, b, ·), in scratch when it is flat.
func (t *Table) read(a, b, k int, scratch *[blockCols]float64) *[blockCols]float64 {
	if t.kept(a, b, k) {
		return t.seg(a, b, k)
	}
	v := t.floor[t.entry(a, b)]
	for w := range scratch {
		scratch[w] = v
	}
	for w := t.slots + 1 - k*blockCols; w < blockCols; w++ {
		scratch[w] = math.Inf(1)
	}
	return scratch
}

// at returns D(a, b, m) = C(a, b, m) + S_a (fill.go), 0 ≤ m ≤ S.
func (t *Table) at(a, b, m int) float64 {
	if e := t.entry(a, b); m >= int(t.flatAt[e]) {
		return t.floor[e]
	}
	return t.seg(a, b, m/blockCols)[m%blockCols]
}

// leafNeed returns the slots C(a, a, ·) needs besides a_a under option o:
// F_all(a) then B(a), with δ_{a+1} live.
func (t *Table) leafNeed(a int, o slotOption) int {
	return t.dlt[a+1] + o.tape + max(o.fatmp, o.btmp)
}

// chainNeed returns the slots the chain choice at (a, b) needs under
// option o: F_all(a) with δ_{b+1} live, the rest with ā_{a+1} kept, then
// B(a) with δ_{a+1} live.
func (t *Table) chainNeed(a, b int, o slotOption) int {
	return max(t.dlt[b+1]+o.tape+o.fatmp, t.dlt[a+1]+o.tape+o.btmp, o.tape)
}

// checkpointNeed returns the slots the checkpoint choice j needs at (a, b)
// given span, the peak of F_ck(a), F_n(a+1) … F_n(j−1) without δ_{b+1}
// (spanNeed): those forwards with δ_{b+1} live, and a_j kept.
func (t *Table) checkpointNeed(b, j, span int) int {
	return max(t.dlt[b+1]+span, t.act[j])
}

// spanNeed returns the peak of F_ck(a), F_n(a+1) … F_n(j−1) besides a_a
// and δ_{b+1}, given spanNeed(a, j−1) (ignored when j = a+1).
func (t *Table) spanNeed(a, j, prev int) int {
	if j == a+1 {
		return t.act[a+1] + t.ftmp[a]
	}
	k := j - 1
	return max(prev, t.act[k]+t.act[k+1]+t.ftmp[k])
}

// budgetSlots returns the slots left besides a_0 and the call arguments
// for a budget in bytes.
func (t *Table) budgetSlots(budget mem.Bytes) int {
	if budget > t.maxBud {
		budget = t.maxBud
	}
	return min(int(budget/t.unit)-t.held, t.lastCol)
}

// Cost returns the optimal cost for a budget up to the table's maximum, or
// +Inf when no schedule fits. O(1).
func (t *Table) Cost(budget mem.Bytes) float64 {
	m := t.budgetSlots(budget)
	if m < 0 {
		return math.Inf(1)
	}
	return t.at(0, t.l, m)
}

// MinBudget returns the least budget at which the table finds a schedule,
// or MaxInt64 when it finds none. O(slots).
func (t *Table) MinBudget() mem.Bytes {
	for m := 0; m <= t.lastCol; m++ {
		if !math.IsInf(t.at(0, t.l, m), 1) {
			return mem.Bytes(m+t.held) * t.unit
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
	if m < 0 || math.IsInf(t.at(0, t.l, m), 1) {
		return nil, &ErrInfeasible{Budget: budget}
	}
	var s Schedule
	t.emit(&s, 0, t.l, m)
	return s, nil
}

func (t *Table) emit(s *Schedule, a, b, m int) {
	kind, x := t.choose(a, b, m)
	switch kind {
	case choseLoss:
		*s = append(*s, Op{Kind: Loss, Stage: t.l})
	case choseCheckpoint:
		*s = append(*s, Op{Kind: FCk, Stage: a})
		for k := a + 1; k < x; k++ {
			*s = append(*s, Op{Kind: FN, Stage: k})
		}
		t.emit(s, x, b, m-t.act[x])
		t.emit(s, a, x-1, m)
	default:
		o := t.opts[a][x]
		*s = append(*s, Op{Kind: FAll, Stage: a, Option: o.k})
		if kind == choseChain {
			t.emit(s, a+1, b, m-o.tape)
		}
		*s = append(*s, Op{Kind: B, Stage: a})
	}
}

// The choices at an entry of the table.
const (
	choseLoss       = iota // the loss op (a = b = L)
	choseLeaf              // F_all(a) with option x, then B(a) (a = b)
	choseChain             // F_all(a) with option x, C(a+1, b), B(a)
	choseCheckpoint        // keep a_x: F_ck(a) … F_n(x−1), C(x, b), C(a, x−1)
)

// choose returns the cheapest choice at the finite entry (a, b, m), by the
// recurrence on the filled table, in the arithmetic of the fill (fill.go),
// so that its value is the entry's; the first of equal ones, in the order
// leaf or chain options, then checkpoints. O(b − a + V).
func (t *Table) choose(a, b, m int) (kind, x int) {
	if a == t.l {
		return choseLoss, 0
	}
	best := math.Inf(1)
	if a == b {
		for q, o := range t.opts[a] {
			if v := t.sumFw[a+1] + o.bw; m >= t.leafNeed(a, o) && v < best {
				best, kind, x = v, choseLeaf, q
			}
		}
		return kind, x
	}
	for q, o := range t.opts[a] {
		if m < t.chainNeed(a, b, o) {
			continue
		}
		if v := o.bw + t.at(a+1, b, m-o.tape); v < best {
			best, kind, x = v, choseChain, q
		}
	}
	span := 0
	for j := a + 1; j <= b; j++ {
		span = t.spanNeed(a, j, span)
		if m < t.checkpointNeed(b, j, span) {
			continue
		}
		if v := t.at(a, j-1, m) + t.at(j, b, m-t.act[j]) - t.sumFw[a]; v < best {
			best, kind, x = v, choseCheckpoint, j
		}
	}
	if math.IsInf(best, 1) {
		panic(fmt.Sprintf("solver: no choice at D(%d, %d, %d) = %v", a, b, m, t.at(a, b, m)))
	}
	return kind, x
}
