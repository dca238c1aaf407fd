package solver

import (
	"math/big"
	"testing"

	"github.com/ckptplan/ckptplan/mem"
)

// griewankT is the closed form t(l, s) = r·l − C(s+r, s+1), with r the
// integer such that C(s+r−1, s) < l ≤ C(s+r, s).
func griewankT(l, s int) int {
	binom := func(n, k int) int { return int(new(big.Int).Binomial(int64(n), int64(k)).Int64()) }
	r := 0
	for binom(s+r, s) < l {
		r++
	}
	return r*l - binom(s+r, s+1)
}

// homogeneous is the chain of Griewank's setting: every stage costs 1
// forward and bw backward, activations are 1 byte, tapes x bytes.
func homogeneous(l int, bw float64, x mem.Bytes) *Chain {
	c := &Chain{LossBackward: bw}
	for i := 0; i <= l; i++ {
		c.ActBytes = append(c.ActBytes, 1)
	}
	for i := 0; i < l; i++ {
		c.Forward = append(c.Forward, 1)
		c.Backward = append(c.Backward, bw)
		c.TapeBytes = append(c.TapeBytes, x)
		c.ForwardTempBytes = append(c.ForwardTempBytes, 0)
		c.BackwardTempBytes = append(c.BackwardTempBytes, 0)
	}
	return c
}

func TestGriewankClosedForm(t *testing.T) {
	for _, v := range []struct{ l, s, want int }{{10, 3, 15}, {12, 2, 28}, {64, 4, 200}, {100, 5, 316}, {1000, 10, 3636}} {
		if got := griewankT(v.l, v.s); got != v.want {
			t.Errorf("closed form t(%d,%d) = %d, want %d", v.l, v.s, got, v.want)
		}
		if got := RevolveSteps(v.l, v.s); got != v.want {
			t.Errorf("RevolveSteps(%d,%d) = %d, want %d", v.l, v.s, got, v.want)
		}
	}
	for l := 1; l <= 40; l++ {
		for s := 1; s <= 6; s++ {
			if got, want := RevolveSteps(l, s), griewankT(l, s); got != want {
				t.Errorf("RevolveSteps(%d,%d) = %d, closed form %d", l, s, got, want)
			}
		}
	}
}

// TestGriewankOracle: on homogeneous chains whose tapes are too large for
// two to be kept (x > M/2), with M = x + 2 + s, the optimal cost is
// L + t(L, s) + bw·(L+1), and Revolve with s snapshots replays at that
// cost within M.
func TestGriewankOracle(t *testing.T) {
	const bw = 3
	for _, v := range []struct{ l, s, want int }{{10, 3, 15}, {12, 2, 28}, {64, 4, 200}, {100, 5, 316}, {1000, 10, 3636}} {
		x := mem.Bytes(v.s + 3)
		c := homogeneous(v.l, bw, x)
		budget := x + 2 + mem.Bytes(v.s)
		want := float64(v.l + v.want + bw*(v.l+1))
		rev, err := Simulate(c, Revolve(c, v.s))
		if err != nil {
			t.Fatalf("revolve l=%d s=%d: %v", v.l, v.s, err)
		}
		if rev.Cost != want || rev.Peak > budget {
			t.Errorf("revolve l=%d s=%d: cost %v peak %d, want cost %v within %d", v.l, v.s, rev.Cost, rev.Peak, want, budget)
		}
		if v.l > 100 && testing.Short() {
			continue
		}
		tab, err := NewTable(c, budget, int(budget))
		if err != nil {
			t.Fatal(err)
		}
		if got := tab.Cost(budget); got != want {
			t.Errorf("optimal l=%d s=%d: cost %v, want %v", v.l, v.s, got, want)
		}
	}
}

// TestRevolveTables: the tables Revolve uses equal the recurrence
// T(n, k) = min_j j + T(n−j, k−1) + T(j, k), its first minimizing j
// included, computed plainly here.
func TestRevolveTables(t *testing.T) {
	const l, s = 40, 45
	want := make([][]int, l+1)
	split := make([][]int, l+1)
	for n := range want {
		want[n], split[n] = make([]int, s+1), make([]int, s+1)
		for k := 0; k <= s; k++ {
			switch {
			case n <= 1:
			case k == 0:
				want[n][k] = n * (n - 1) / 2
			default:
				want[n][k] = -1
				for j := 1; j < n; j++ {
					if v := j + want[n-j][k-1] + want[j][k]; want[n][k] < 0 || v < want[n][k] {
						want[n][k], split[n][k] = v, j
					}
				}
			}
		}
	}
	got, gotSplit := revolveTables(l, s)
	for n := range want {
		for k := range want[n] {
			if got[n][k] != want[n][k] || gotSplit[n][k] != split[n][k] {
				t.Fatalf("T(%d, %d) = %d split %d, want %d split %d", n, k, got[n][k], gotSplit[n][k], want[n][k], split[n][k])
			}
		}
	}
}
