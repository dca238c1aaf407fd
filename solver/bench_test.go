package solver

import (
	"math/rand"
	"testing"
)

// BenchmarkTable fills the optimal table for 100 stages and 1000 slots.
func BenchmarkTable(b *testing.B) {
	r := rand.New(rand.NewSource(1))
	c := randomChain(r, 100)
	budget := int64(1000)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := NewTable(c, budget, 1000); err != nil {
			b.Fatal(err)
		}
	}
}
