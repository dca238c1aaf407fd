package solver

import (
	"fmt"
	"math"
	"math/rand"
	"testing"
	"time"

	"github.com/ckptplan/ckptplan/mem"
)

// rotorReference is the persistent dynamic program written plainly from
// the paper (Beaumont et al., INRIA RR-9302, 2019, section 4), in the loop
// order of rotor's own implementation: the memory m outermost, then the
// interval length d, the start a and the split j. It fills one table whose
// plane m holds every interval (a, b). Where the chain has options (keep
// sets), the leaf and the chain choice take the cheapest that fits, as the
// selective strategy does; the paper has none. It is the yardstick the table is measured and checked
// against, so it shares no code with rotor.go.
//
// Memory is counted in bytes (one slot each), m being what is available
// besides a_a, as in NewTable. With deltaOnTop the backward B(i) needs
// δ_i on top of δ_{i+1}, ā_{i+1} and its transients, as the paper counts
// it; without, it needs what Simulate charges, so that the two tables
// must agree entry for entry.
type rotorReference struct {
	l, maxM int
	cost    []float64 // plane m at m·rows, interval (a, b) at tri(a, b)
	split   []int32   // j > 0: checkpoint a_j; −1: chain; −2: leaf
	rows    int
}

func (r *rotorReference) tri(a, b int) int { return a*(2*(r.l+1)-a+1)/2 + b - a }

// at returns C(a, b, m), +Inf for m < 0.
func (r *rotorReference) at(a, b, m int) float64 {
	if m < 0 {
		return math.Inf(1)
	}
	return r.cost[m*r.rows+r.tri(a, b)]
}

func newRotorReference(c *Chain, maxM int, deltaOnTop bool) *rotorReference {
	l := c.Len()
	x := make([]int, l+2) // x_0 … x_L, x_{L+1} = 0
	for i, b := range c.ActBytes {
		x[i] = int(b)
	}
	r := &rotorReference{l: l, maxM: maxM, rows: (l + 1) * (l + 2) / 2}
	r.cost = make([]float64, (maxM+1)*r.rows)
	r.split = make([]int32, (maxM+1)*r.rows)
	inf := math.Inf(1)
	// needB is what B(i) holds under option o, besides a_i.
	needB := func(i int, o Option) int {
		n := x[i+1] + int(o.TapeBytes) + int(o.BackwardTempBytes)
		if deltaOnTop {
			n += x[i]
		}
		return n
	}
	for m := 0; m <= maxM; m++ {
		plane := r.cost[m*r.rows:][:r.rows]
		split := r.split[m*r.rows:][:r.rows]
		for i := 0; i <= l; i++ {
			k := r.tri(i, i)
			plane[k], split[k] = inf, -2
			if i == l {
				if m >= int(c.LossTempBytes) {
					plane[k] = c.LossBackward
				}
				continue
			}
			for q := range c.NumOptions(i) {
				o := c.Option(i, q)
				if m >= x[i+1]+int(o.TapeBytes)+int(o.FAllTempBytes) && m >= needB(i, o) {
					plane[k] = min(plane[k], c.Forward[i]+o.Backward)
				}
			}
		}
		for d := 1; d <= l; d++ {
			for a := 0; a+d <= l; a++ {
				b := a + d
				best, bestJ := inf, int32(0)
				// F_ck(a), then F_n(a+1) … F_n(j−1), each with δ_{b+1} live.
				need := x[b+1] + x[a+1] + int(c.ForwardTempBytes[a])
				sumFw := 0.0
				for j := a + 1; j <= b; j++ {
					if j > a+1 {
						k := j - 1
						need = max(need, x[b+1]+x[k]+x[k+1]+int(c.ForwardTempBytes[k]))
					}
					sumFw += c.Forward[j-1]
					if m >= need && m >= x[j] {
						if v := sumFw + r.at(j, b, m-x[j]) + r.at(a, j-1, m); v < best {
							best, bestJ = v, int32(j)
						}
					}
				}
				for q := range c.NumOptions(a) {
					o := c.Option(a, q)
					tape := int(o.TapeBytes)
					if m >= x[b+1]+tape+int(o.FAllTempBytes) && m >= needB(a, o) && m >= tape {
						if v := c.Forward[a] + o.Backward + r.at(a+1, b, m-tape); v < best {
							best, bestJ = v, -1
						}
					}
				}
				k := r.tri(a, b)
				plane[k], split[k] = best, bestJ
			}
		}
	}
	return r
}

// benchChain is a random chain of l stages whose sizes are whole bytes
// scaled so that storing every tape needs about three times maxM: the
// budgets 0…maxM span the region where checkpointing decides the cost.
// Costs are whole numbers, so every sum is exact.
func benchChain(r *rand.Rand, l, maxM int) *Chain {
	unit := max(maxM/l, 1)
	c := &Chain{LossBackward: float64(1 + r.Intn(5)), LossTempBytes: mem.Bytes(r.Intn(unit + 1))}
	for i := 0; i <= l; i++ {
		c.ActBytes = append(c.ActBytes, mem.Bytes(1+r.Intn(unit)))
	}
	for i := 0; i < l; i++ {
		c.Forward = append(c.Forward, float64(1+r.Intn(100)))
		c.Backward = append(c.Backward, float64(1+r.Intn(200)))
		c.TapeBytes = append(c.TapeBytes, c.ActBytes[i+1]+mem.Bytes(r.Intn(2*unit+1)))
		c.ForwardTempBytes = append(c.ForwardTempBytes, mem.Bytes(r.Intn(unit+1)))
		c.BackwardTempBytes = append(c.BackwardTempBytes, mem.Bytes(r.Intn(unit+1)))
	}
	return c
}

// TestTableMatchesRotorReference: on random chains, every entry C(a, b, m)
// of the table equals the plain recurrence's when both count memory as
// Simulate does, and C(0, L, m) is never above the paper's, which holds
// δ_i on top during B(i). The chains are long enough for the fill's tiles
// (32 stages) and blocks (32 columns), some with transients large enough
// to rule out many splits at many budgets, some with costs in halves
// (exact sums, but not integers: no floors).
func TestTableMatchesRotorReference(t *testing.T) {
	r := rand.New(rand.NewSource(13))
	for k := 0; k < 200; k++ {
		l := 1 + r.Intn(90)
		maxM := 1 + r.Intn(150)
		c := benchChain(r, l, maxM)
		if k%4 == 1 {
			for i := range c.Forward {
				c.Forward[i] += 0.5
			}
		}
		if k%3 == 0 {
			for i := range c.ForwardTempBytes {
				if r.Intn(4) == 0 {
					c.ForwardTempBytes[i] += mem.Bytes(r.Intn(maxM/2 + 1))
				}
			}
		}
		tab, err := NewTable(c, mem.Bytes(maxM), maxM)
		if err != nil {
			t.Fatal(err)
		}
		same := newRotorReference(c, maxM, false)
		paper := newRotorReference(c, maxM, true)
		for a := 0; a <= l; a++ {
			for b := a; b <= l; b++ {
				for m := 0; m <= maxM; m++ {
					got := tab.at(a, b, m) - tab.sumFw[a]
					if want := same.at(a, b, m); got != want {
						t.Fatalf("chain %d (%d stages), C(%d, %d, %d): table %v, reference %v", k, l, a, b, m, got, want)
					}
				}
			}
		}
		for m := 0; m <= maxM; m++ {
			if got, p := tab.at(0, l, m), paper.at(0, l, m); got > p {
				t.Fatalf("chain %d (%d stages), m = %d: table %v above the paper's %v", k, l, m, got, p)
			}
		}
	}
}

// TestTableWithOptionsMatchesReference: the same with up to three options
// a stage, each keeping less of the tape for a dearer backward, and
// storing forwards with transients of their own.
func TestTableWithOptionsMatchesReference(t *testing.T) {
	r := rand.New(rand.NewSource(14))
	for k := 0; k < 60; k++ {
		l := 1 + r.Intn(80)
		maxM := 1 + r.Intn(120)
		c := benchChain(r, l, maxM)
		c.FAllTempBytes = make([]mem.Bytes, l)
		c.Options = make([][]Option, l)
		for i := range c.Options {
			c.FAllTempBytes[i] = mem.Bytes(r.Intn(maxM/l + 2))
			for n := r.Intn(4); n > 0; n-- {
				extra := c.TapeBytes[i] - c.ActBytes[i+1]
				c.Options[i] = append(c.Options[i], Option{
					TapeBytes:         c.ActBytes[i+1] + mem.Bytes(r.Int63n(int64(extra+1))),
					FAllTempBytes:     mem.Bytes(r.Intn(maxM/l + 2)),
					Backward:          c.Backward[i] + float64(r.Intn(50)),
					BackwardTempBytes: c.BackwardTempBytes[i] + mem.Bytes(r.Intn(maxM/l+2)),
				})
			}
		}
		tab, err := NewTable(c, mem.Bytes(maxM), maxM)
		if err != nil {
			t.Fatal(err)
		}
		ref := newRotorReference(c, maxM, false)
		for a := 0; a <= l; a++ {
			for b := a; b <= l; b++ {
				for m := 0; m <= maxM; m++ {
					if got, want := tab.at(a, b, m)-tab.sumFw[a], ref.at(a, b, m); got != want {
						t.Fatalf("chain %d (%d stages), C(%d, %d, %d): table %v, reference %v", k, l, a, b, m, got, want)
					}
				}
			}
		}
	}
}

// BenchmarkRotorReference fills the plain recurrence's table and
// NewTable's on the same chains at the same 1-byte slots, for L = 30 …
// 400 and S = 500 … 5000, and reports the seconds of each and their
// ratio; it fails if the table's cost is above the reference's anywhere.
// The largest size takes a few minutes and about 8 GB:
//
//	go test -run XXX -bench RotorReference -benchtime 1x -cpu 1 ./solver
func BenchmarkRotorReference(b *testing.B) {
	for _, l := range []int{30, 100, 200, 400} {
		for _, s := range []int{500, 1000, 5000} {
			b.Run(fmt.Sprintf("L=%d/S=%d", l, s), func(b *testing.B) {
				c := benchChain(rand.New(rand.NewSource(int64(l*s))), l, s)
				var ref, ours time.Duration
				for b.Loop() {
					start := time.Now()
					rr := newRotorReference(c, s, true)
					ref += time.Since(start)
					start = time.Now()
					tab, err := NewTable(c, mem.Bytes(s), s)
					ours += time.Since(start)
					if err != nil {
						b.Fatal(err)
					}
					for m := 0; m <= s; m++ {
						if got, want := tab.at(0, l, m), rr.at(0, l, m); got > want {
							b.Fatalf("m = %d: table %v above the reference's %v", m, got, want)
						}
					}
				}
				b.ReportMetric(ref.Seconds()/float64(b.N), "ref-s/op")
				b.ReportMetric(ours.Seconds()/float64(b.N), "ckptplan-s/op")
				b.ReportMetric(ref.Seconds()/ours.Seconds(), "speedup")
			})
		}
	}
}

// FuzzTableMatchesRotorReference: for any chain of up to 70 stages whose
// sizes and costs are small integers, zero included (an activation of 0
// bytes, a forward that costs nothing), every entry of the table equals
// the plain recurrence's.
func FuzzTableMatchesRotorReference(f *testing.F) {
	f.Add([]byte{3, 40, 1, 2, 3, 4, 5, 6, 7, 8, 9})
	f.Add([]byte{40, 200, 0, 0, 0, 0, 0, 0, 255, 1, 2, 3})
	f.Fuzz(func(t *testing.T, data []byte) {
		if len(data) < 3 {
			return
		}
		l, maxM := 1+int(data[0])%70, 1+int(data[1])%150
		data = data[2:]
		next := func() int {
			if len(data) == 0 {
				return 1
			}
			v := int(data[0])
			data = data[1:]
			return v
		}
		size := func() mem.Bytes { return mem.Bytes(next() % (maxM/4 + 2)) }
		c := &Chain{LossBackward: float64(next() % 8), LossTempBytes: size()}
		for i := 0; i <= l; i++ {
			c.ActBytes = append(c.ActBytes, size())
		}
		for i := 0; i < l; i++ {
			c.Forward = append(c.Forward, float64(next()%16))
			c.Backward = append(c.Backward, float64(next()%32))
			c.TapeBytes = append(c.TapeBytes, c.ActBytes[i+1]+size())
			c.ForwardTempBytes = append(c.ForwardTempBytes, size())
			c.BackwardTempBytes = append(c.BackwardTempBytes, size())
		}
		tab, err := NewTable(c, mem.Bytes(maxM), maxM)
		if err != nil {
			t.Fatal(err)
		}
		ref := newRotorReference(c, maxM, false)
		for a := 0; a <= l; a++ {
			for b := a; b <= l; b++ {
				for m := 0; m <= maxM; m++ {
					if got, want := tab.at(a, b, m)-tab.sumFw[a], ref.at(a, b, m); got != want {
						t.Fatalf("C(%d, %d, %d): table %v, reference %v", a, b, m, got, want)
					}
				}
			}
		}
	})
}
