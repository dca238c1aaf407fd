package solver

import (
	"container/heap"
	"math"
	"math/rand"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// exhaustive returns the least cost of any valid (persistent) schedule of c
// whose every op fits in budget (Simulate's rules), by Dijkstra's algorithm over live
// sets; +Inf when none fits. A live set is which activations and tapes are
// live and which gradient: O(4^L·L) states.
func exhaustive(c *Chain, budget mem.Bytes) float64 {
	cost, _ := exhaustiveSchedule(c, budget)
	return cost
}

// exhaustiveSchedule also returns a best schedule.
func exhaustiveSchedule(c *Chain, budget mem.Bytes) (float64, Schedule) {
	l := c.Len()
	type st struct {
		act, tape, ckpt uint32
		delta           int      // index of the live gradient, -1 before the loss
		opt             [8]uint8 // opt[i]: the option of the live tape ā_i
	}
	live := func(s st) mem.Bytes {
		var b mem.Bytes
		for i := 0; i <= l; i++ {
			if s.act&(1<<i) != 0 {
				b += c.ActBytes[i]
			}
			if i < l && s.tape&(1<<(i+1)) != 0 {
				b += c.Option(i, int(s.opt[i+1])).TapeBytes
			}
		}
		if s.delta >= 0 {
			b += c.ActBytes[s.delta] + gradsFrom(c, s.delta)
		}
		return b
	}
	hasAct := func(s st, i int) bool { return s.act&(1<<i) != 0 || s.tape&(1<<i) != 0 }
	start := st{act: 1, delta: -1}
	if c.ActBytes[0] > budget {
		return math.Inf(1), nil
	}
	parent := map[st]st{}
	via := map[st]Op{}
	dist := map[st]float64{start: 0}
	pq := &costHeap{{0, 0}}
	states := []st{start}
	for pq.Len() > 0 {
		it := heap.Pop(pq).(costItem)
		s := states[it.state]
		if it.cost > dist[s] {
			continue
		}
		if s.delta == 0 {
			var sched Schedule
			for x := s; x != start; x = parent[x] {
				sched = append(Schedule{via[x]}, sched...)
			}
			return it.cost, sched
		}
		var op Op
		relax := func(n st, peak mem.Bytes, cost float64) {
			if peak > budget || live(n) > budget {
				return
			}
			if d, ok := dist[n]; !ok || it.cost+cost < d {
				dist[n] = it.cost + cost
				parent[n], via[n] = s, op
				states = append(states, n)
				heap.Push(pq, costItem{it.cost + cost, len(states) - 1})
			}
		}
		cur := live(s)
		for i := 0; i < l; i++ {
			if !hasAct(s, i) || hasAct(s, i+1) || s.delta >= 0 && i+1 > s.delta {
				continue
			}
			// F_ck and F_n
			n := s
			n.act |= 1 << (i + 1)
			if s.act&(1<<i) != 0 {
				n.ckpt |= 1 << i
			}
			op = Op{Kind: FCk, Stage: i}
			relax(n, cur+c.ActBytes[i+1]+c.ForwardTempBytes[i], c.Forward[i])
			if s.ckpt&(1<<i) == 0 {
				n = s
				n.act |= 1 << (i + 1)
				n.act &^= 1 << i
				op = Op{Kind: FN, Stage: i}
				relax(n, cur+c.ActBytes[i+1]+c.ForwardTempBytes[i], c.Forward[i])
			}
			for k := 0; k < c.NumOptions(i); k++ {
				o := c.Option(i, k)
				n = s
				n.tape |= 1 << (i + 1)
				n.opt[i+1] = uint8(k)
				op = Op{Kind: FAll, Stage: i, Option: k}
				relax(n, cur+o.TapeBytes+o.FAllTempBytes, c.Forward[i])
			}
		}
		if s.delta < 0 && hasAct(s, l) {
			n := s
			n.delta = l
			n.act &^= 1 << l
			n.ckpt &^= 1 << l
			op = Op{Kind: Loss, Stage: l}
			relax(n, cur+c.LossTempBytes, c.LossBackward)
		}
		if i := s.delta - 1; i >= 0 && s.tape&(1<<(i+1)) != 0 && hasAct(s, i) {
			o := c.Option(i, int(s.opt[i+1]))
			n := s
			n.tape &^= 1 << (i + 1)
			n.opt[i+1] = 0
			n.delta = i
			n.act &^= 1 << i
			n.ckpt &^= 1 << i
			op = Op{Kind: B, Stage: i}
			relax(n, cur+o.BackwardTempBytes, o.Backward)
		}
	}
	return math.Inf(1), nil
}

type costItem struct {
	cost  float64
	state int
}

type costHeap []costItem

func (h costHeap) Len() int           { return len(h) }
func (h costHeap) Less(i, j int) bool { return h[i].cost < h[j].cost }
func (h costHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *costHeap) Push(x any)        { *h = append(*h, x.(costItem)) }
func (h *costHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

// randomChain returns a chain of l stages with small integer costs and sizes.
func randomChain(r *rand.Rand, l int) *Chain {
	c := &Chain{LossBackward: float64(r.Intn(3)), LossTempBytes: mem.Bytes(r.Intn(3))}
	for i := 0; i <= l; i++ {
		c.ActBytes = append(c.ActBytes, mem.Bytes(1+r.Intn(4)))
	}
	for i := 0; i < l; i++ {
		c.Forward = append(c.Forward, float64(1+r.Intn(5)))
		c.Backward = append(c.Backward, float64(1+r.Intn(8)))
		c.TapeBytes = append(c.TapeBytes, c.ActBytes[i+1]+mem.Bytes(r.Intn(7)))
		c.ForwardTempBytes = append(c.ForwardTempBytes, mem.Bytes(r.Intn(3)))
		c.FAllTempBytes = append(c.FAllTempBytes, mem.Bytes(r.Intn(3)))
		c.BackwardTempBytes = append(c.BackwardTempBytes, mem.Bytes(r.Intn(4)))
	}
	if r.Intn(2) == 0 {
		withGrads(r, c)
	}
	return c
}

// withGrads gives every stage of c parameter gradients of up to 3 bytes,
// counted in its backward's transients as the chain requires, the
// backward up to 2 bytes held from the loss op on, counted in the loss's,
// and, half the time, the loss and its gradient held to the backward's
// end.
func withGrads(r *rand.Rand, c *Chain) {
	c.GradBytes = make([]mem.Bytes, c.Len())
	for i := range c.GradBytes {
		c.GradBytes[i] = mem.Bytes(r.Intn(4))
		c.BackwardTempBytes[i] += c.GradBytes[i]
	}
	c.BackwardHeldBytes = mem.Bytes(r.Intn(3))
	c.LossTempBytes += c.BackwardHeldBytes
	c.HoldsLoss = r.Intn(2) == 0
}

// gradsFrom returns the parameter gradients B(i) … B(L−1) make and what
// the backward holds: live with δ_i, the loss and its gradient with a δ_i
// below δ_L, which holds them as a_L and itself.
func gradsFrom(c *Chain, i int) mem.Bytes {
	g := c.BackwardHeldBytes
	if i < c.Len() && c.HoldsLoss {
		g += 2 * c.ActBytes[c.Len()]
	}
	for k := i; k < len(c.GradBytes); k++ {
		g += c.GradBytes[k]
	}
	return g
}

// withOptions gives every stage of c up to three random options, each
// keeping a smaller tape for a dearer backward.
func withOptions(r *rand.Rand, c *Chain) *Chain {
	c.Options = make([][]Option, c.Len())
	for i := range c.Options {
		for k := r.Intn(4); k > 0; k-- {
			extra := c.TapeBytes[i] - c.ActBytes[i+1]
			c.Options[i] = append(c.Options[i], Option{
				TapeBytes:         c.ActBytes[i+1] + mem.Bytes(r.Int63n(int64(extra+1))),
				FAllTempBytes:     mem.Bytes(r.Intn(4)),
				Backward:          c.Backward[i] + float64(r.Intn(4)),
				BackwardTempBytes: c.BackwardTempBytes[i] + mem.Bytes(r.Intn(5)),
			})
		}
	}
	return c
}

// storeAllPeak is the peak of storing every tape, the most any sensible
// schedule needs.
func storeAllPeak(t *testing.T, c *Chain) mem.Bytes {
	r, err := Simulate(c, StoreAll(c))
	if err != nil {
		t.Fatal(err)
	}
	return r.Peak
}

// TestOptimalIsExhaustive compares the table with an exhaustive search on
// thousands of random chains of up to 6 stages, at budgets from below the
// smallest feasible one to storing everything, with one byte per slot.
func TestOptimalIsExhaustive(t *testing.T) { testExhaustive(t, false) }

// TestSelectiveIsExhaustive does the same on chains whose stages have
// options: the search may run any option at every F_all.
func TestSelectiveIsExhaustive(t *testing.T) { testExhaustive(t, true) }

func testExhaustive(t *testing.T, options bool) {
	r := rand.New(rand.NewSource(1))
	n := 2000
	if testing.Short() {
		n = 300
	}
	if options {
		n /= 3 // each search explores every option of every F_all
	}
	for k := 0; k < n; k++ {
		l := 1 + r.Intn(6)
		c := randomChain(r, l)
		if options {
			withOptions(r, c)
		}
		top := storeAllPeak(t, c)
		budget := c.ActBytes[0] + mem.Bytes(r.Int63n(int64(top)))
		tab, err := NewTable(c, budget, int(budget))
		if err != nil {
			t.Fatal(err)
		}
		want := exhaustive(c, budget)
		got := tab.Cost(budget)
		if got != want {
			t.Fatalf("chain %d (%+v), budget %d: table cost %v, exhaustive %v", k, *c, budget, got, want)
		}
		if math.IsInf(got, 1) {
			continue
		}
		s, err := tab.Schedule(budget)
		if err != nil {
			t.Fatal(err)
		}
		res, err := Simulate(c, s)
		if err != nil {
			t.Fatalf("chain %d: schedule %v does not replay: %v", k, s, err)
		}
		if res.Cost != got || res.Peak > budget {
			t.Fatalf("chain %d: schedule replays at cost %v peak %d, table says cost %v within %d", k, res.Cost, res.Peak, got, budget)
		}
	}
}
