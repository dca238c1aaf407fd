package solver

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// BenchmarkTable fills the optimal table for 100 stages and 1000 slots.
func BenchmarkTable(b *testing.B) {
	r := rand.New(rand.NewSource(1))
	c := randomChain(r, 100)
	budget := mem.Bytes(1000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewTable(c, budget, 1000); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkTableOptions is BenchmarkTable with 16 options per stage, none
// dominating another: the chain term grows by O(S·L²·V), small beside the
// checkpoints' O(S·L³).
func BenchmarkTableOptions(b *testing.B) {
	r := rand.New(rand.NewSource(1))
	c := randomChain(r, 100)
	c.Options = make([][]Option, c.Len())
	for i := range c.Options {
		c.TapeBytes[i] = c.ActBytes[i+1] + 640
		for k := mem.Bytes(1); k <= 16; k++ {
			c.Options[i] = append(c.Options[i], Option{
				TapeBytes:         c.ActBytes[i+1] + (c.TapeBytes[i]-c.ActBytes[i+1])*(16-k)/16,
				Backward:          c.Backward[i] + float64(k),
				BackwardTempBytes: c.BackwardTempBytes[i],
			})
		}
	}
	budget := mem.Bytes(32000) // half of storing every tape
	b.ReportAllocs()
	for b.Loop() {
		t, err := NewTable(c, budget, 1000)
		if err != nil {
			b.Fatal(err)
		}
		if n := len(t.opts[0]); n != 17 {
			b.Fatalf("%d options left of 17", n)
		}
	}
}

// BenchmarkTableLong fills the table of long chains at 1000 slots over
// the peak of storing everything, as planning does.
func BenchmarkTableLong(b *testing.B) {
	for _, l := range []int{200, 400, 600} {
		b.Run(fmt.Sprint(l), func(b *testing.B) {
			c := benchChain(rand.New(rand.NewSource(int64(l))), l, 1000)
			all, err := Simulate(c, StoreAll(c))
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				if _, err := NewTable(c, all.Peak, 1000); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
