package solver

// Per-layer schedules: what a trainer's activation checkpointing runs.
//
// A trainer checkpoints layer by layer (Hugging Face's
// gradient_checkpointing_enable, torch.utils.checkpoint around a block,
// torchtitan, FSDP's checkpoint_wrapper): each stage's forward either
// keeps its tape (all of it, or a keep set under selective
// checkpointing) or keeps only its input, and a checkpointed stage is
// rerun once, keeping its tape, right before its backward. Nothing is
// rerun from an earlier checkpoint, and the stages a trainer does not
// wrap (the embedding, the head) keep their whole tape. Those schedules
// are the persistent recurrence's (rotor.go) with every checkpoint split
// at the next stage, j = a+1, and only intervals that end at the loss:
//
//	C(L, m)    = loss backward                        if m ≥ loss temp
//	chain:       C(a, m) = fw_a + bw_a(o) + C(a+1, m − |ā_{a+1}(o)|)
//	checkpoint:  C(a, m) = fw_a + (fw_a + bw_a) + C(a+1, m − |a_{a+1}|)
//
// each under the memory conditions of the table (leafNeed, chainNeed,
// checkpointNeed, spanNeed), on the same grid of slots, so that a
// schedule found fits when replayed, as the table's do. Like the table,
// it counts an output no op saves (Chain.UnsavedActs) as held with the
// tape after it, so that on such chains a per-layer schedule it passes
// over may cost a little less; what it finds still fits. A checkpointed
// stage's rerun keeps its whole tape (option 0), as torch.utils.checkpoint
// does; a pinned stage has only the chain choice, under that tape. One pass
// gives C(0, m) for every budget: O(L·slots·V) time and (L+1)·(slots+1)
// entries, against the table's O(slots·L³).
//
// Example: three stages of forward cost 1 and backward 2, each tape 4
// bytes and each activation 1: with room for two tapes the cheapest
// per-layer schedule checkpoints one stage and pays one more forward;
// the full recurrence may instead rerun two stages from one checkpoint,
// which a trainer cannot.

import (
	"fmt"
	"math"

	"github.com/ckptplan/ckptplan/mem"
)

// A LayerTable holds the cheapest per-layer schedule of a chain at every
// budget up to its maximum: each stage stored under one of its options or
// checkpointed and rerun once, pinned stages stored whole.
type LayerTable struct {
	t      *Table // the grid and the stages in slots (no fill)
	pinned []bool
	full   []slotOption // each stage's option 0, in slots
	// cost[a·(S+1)+m] is C(a, m); how[·] the choice: q ≥ 0 stores stage
	// a under options(a)[q], checkpoint keeps its input and reruns it
	// keeping its whole tape, −1 none fits.
	cost []float64
	how  []int32
}

// NewLayerTable fills the per-layer table of c for budgets up to
// maxBudget (a_0 included) with the given slots (DefaultSlots if ≤ 0), on
// the grid NewTable would use; pinned[i] (nil: none) keeps stage i's
// whole tape. O(slots·L·V).
func NewLayerTable(c *Chain, maxBudget mem.Bytes, slots int, pinned []bool) (*LayerTable, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	if maxBudget <= 0 {
		return nil, &ErrInfeasible{Budget: maxBudget}
	}
	if pinned != nil && len(pinned) != c.Len() {
		return nil, fmt.Errorf("%d pinned flags for %d stages", len(pinned), c.Len())
	}
	if slots <= 0 {
		slots = DefaultSlots
	}
	slots = int(min(mem.Bytes(slots), maxBudget))
	// 12 bytes an entry (a cost and a choice), compared by division: the
	// product of a huge slot count would wrap.
	if mem.Bytes(slots) >= MaxTableBytes/(12*mem.Bytes(c.Len()+1)) {
		return nil, fmt.Errorf("the per-layer table of %d stages at %d slots would take more than the %v ckptplan allows: use fewer slots", c.Len(), slots, MaxTableBytes)
	}
	t := &Table{c: c, l: c.Len(), slots: slots, maxBud: maxBudget}
	t.unit = (maxBudget + mem.Bytes(slots) - 1) / mem.Bytes(slots)
	if err := t.prepare(); err != nil {
		return nil, err
	}
	t.lastCol = slots
	lt := &LayerTable{t: t, pinned: pinned}
	for i := range t.l {
		o := c.Option(i, 0)
		lt.full = append(lt.full, slotOption{t.toSlots(o.TapeBytes), t.toSlots(o.FAllTempBytes), t.toSlots(o.BackwardTempBytes), o.Backward, 0})
	}
	lt.fill()
	return lt, nil
}

// options returns the options stage a may keep its tape under.
func (lt *LayerTable) options(a int) []slotOption {
	if lt.pinned != nil && lt.pinned[a] {
		return lt.full[a : a+1]
	}
	return lt.t.opts[a]
}

func (lt *LayerTable) fill() {
	t := lt.t
	n := t.slots + 1
	lt.cost = make([]float64, (t.l+1)*n)
	lt.how = make([]int32, len(lt.cost))
	inf := math.Inf(1)
	loss := lt.cost[t.l*n:]
	for m := range n {
		loss[m] = inf
		if m >= t.lossTmp {
			loss[m] = t.lossBw
		}
	}
	for a := t.l - 1; a >= 0; a-- {
		row, how, next := lt.cost[a*n:][:n], lt.how[a*n:][:n], lt.cost[(a+1)*n:][:n]
		for m := range n {
			row[m], how[m] = inf, -1
		}
		opts := lt.options(a)
		for q, o := range opts {
			for m := max(t.chainNeed(a, t.l, o), o.tape); m < n; m++ {
				if v := t.fw[a] + o.bw + next[m-o.tape]; v < row[m] {
					row[m], how[m] = v, int32(q)
				}
			}
		}
		if lt.pinned != nil && lt.pinned[a] {
			continue
		}
		// A checkpoint reruns the stage keeping its whole tape.
		o := lt.full[a]
		ck := max(t.checkpointNeed(t.l, a+1, t.spanNeed(a, a+1, 0)), t.act[a+1], t.leafNeed(a, o))
		for m := ck; m < n; m++ {
			if v := 2*t.fw[a] + o.bw + next[m-t.act[a+1]]; v < row[m] {
				row[m], how[m] = v, checkpoint
			}
		}
	}
}

// checkpoint is LayerTable.how's choice of checkpointing a stage.
const checkpoint = -2

// Cost returns the cheapest per-layer schedule's cost at a budget up to
// the table's maximum, or +Inf when none fits. O(1).
func (lt *LayerTable) Cost(budget mem.Bytes) float64 {
	m := lt.t.budgetSlots(budget)
	if m < 0 {
		return math.Inf(1)
	}
	return lt.cost[m]
}

// MinBudget returns the least budget at which a per-layer schedule fits,
// or MaxInt64 when none does. O(slots).
func (lt *LayerTable) MinBudget() mem.Bytes {
	for m := 0; m <= lt.t.slots; m++ {
		if !math.IsInf(lt.cost[m], 1) {
			return mem.Bytes(m+lt.t.held) * lt.t.unit
		}
	}
	return math.MaxInt64
}

// Schedule returns the cheapest per-layer schedule at a budget up to the
// table's maximum, or an *ErrInfeasible. O(L).
func (lt *LayerTable) Schedule(budget mem.Bytes) (Schedule, error) {
	t := lt.t
	m := t.budgetSlots(budget)
	if m < 0 || math.IsInf(lt.cost[m], 1) {
		return nil, &ErrInfeasible{Budget: budget}
	}
	n := t.slots + 1
	checkpointed := make([]bool, t.l)
	options := make([]int, t.l)
	for a := range t.l {
		q := int(lt.how[a*n+m])
		if q == checkpoint {
			checkpointed[a] = true
			m -= t.act[a+1]
			continue
		}
		o := lt.options(a)[q]
		options[a] = o.k
		m -= o.tape
	}
	return PerStage(checkpointed, options), nil
}

// LayerBaselines are the per-layer schedules PerLayer weighs beside its
// table's: storing every tape, and checkpointing every stage not pinned.
func LayerBaselines(c *Chain, pinned []bool) []Schedule {
	every := make([]bool, c.Len())
	for i := range every {
		every[i] = pinned == nil || !pinned[i]
	}
	return []Schedule{StoreAll(c), PerStage(every, nil)}
}

// PerLayer is Optimal for a trainer that checkpoints layer by layer
// (LayerTable): the cheapest per-layer schedule at budget, pinned[i]
// (nil: none) keeping stage i's whole tape. Rounding to slots can cost
// the table a schedule that fits, so it also replays LayerBaselines and
// the alternatives given (each per-layer), and returns the cheapest that
// fits, preferring them at equal cost. A budget nothing fits is an
// *ErrInfeasible whose MinBudget, given back, is planned. O(slots·L·V).
func PerLayer(c *Chain, budget mem.Bytes, slots int, pinned []bool, alternatives ...Schedule) (*Solution, error) {
	all, err := Simulate(c, StoreAll(c))
	if err != nil {
		return nil, err
	}
	candidates := append(LayerBaselines(c, pinned), alternatives...)
	var best *Solution
	need := mem.Bytes(math.MaxInt64)
	for k, s := range candidates {
		r, err := replay(c, s, false)
		if err != nil {
			return nil, fmt.Errorf("per-layer: candidate %d: %w", k, err)
		}
		if r.Peak > budget {
			need = min(need, r.Peak)
		} else if best == nil || r.Cost < best.Cost {
			best = &Solution{Schedule: s, Result: r}
		}
	}
	if budget < all.Peak {
		t, err := NewLayerTable(c, all.Peak, slots, pinned)
		if err != nil {
			return nil, err
		}
		if s, err := t.Schedule(budget); err == nil {
			r, err := Simulate(c, s)
			if err != nil {
				return nil, fmt.Errorf("per-layer: %w", err) // a bug: the table only builds valid schedules
			}
			if r.Peak > budget {
				return nil, fmt.Errorf("per-layer: the table's schedule peaks at %v, above the budget %v", r.Peak, budget) // a bug
			}
			if best == nil || r.Cost < best.Cost {
				best = &Solution{Schedule: s, Result: r}
			}
		}
		need = min(need, t.MinBudget())
	}
	if best == nil {
		return nil, &ErrInfeasible{Budget: budget, MinBudget: need}
	}
	return withTimeline(c, best)
}
