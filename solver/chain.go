package solver

import (
	"errors"
	"fmt"
)

// Chain is a sequence of L stages followed by a loss. Slices indexed by
// activation have L+1 entries (a_0 … a_L); slices indexed by stage have L.
type Chain struct {
	Forward  []float64 // cost of running stage i forward (any kind)
	Backward []float64 // cost of B(i)
	// ActBytes[i] is the size of activation a_i, and of its gradient δ_i.
	ActBytes []int64
	// TapeBytes[i] is what F_all(i) keeps: everything B(i) needs besides
	// a_i, its output a_{i+1} included.
	TapeBytes        []int64
	ForwardTempBytes []int64 // transient bytes during F_ck(i) and F_n(i)
	// FAllTempBytes are the transient bytes during F_all(i) beyond its
	// tape; nil means ForwardTempBytes.
	FAllTempBytes     []int64
	BackwardTempBytes []int64 // transient bytes during B(i)
	LossBackward      float64 // cost of the loss op
	LossTempBytes     int64   // transient bytes during the loss op
}

// Len returns the number of stages L.
func (c *Chain) Len() int { return len(c.Forward) }

// Validate checks the lengths and signs of the chain's slices.
func (c *Chain) Validate() error {
	l := c.Len()
	if l == 0 {
		return errors.New("chain has no stages")
	}
	if len(c.Backward) != l || len(c.TapeBytes) != l || len(c.ForwardTempBytes) != l || len(c.BackwardTempBytes) != l || len(c.ActBytes) != l+1 ||
		c.FAllTempBytes != nil && len(c.FAllTempBytes) != l {
		return fmt.Errorf("chain slices have inconsistent lengths for %d stages", l)
	}
	for i := 0; i < l; i++ {
		if c.Forward[i] < 0 || c.Backward[i] < 0 || c.ForwardTempBytes[i] < 0 || c.BackwardTempBytes[i] < 0 || c.FAllTemp(i) < 0 {
			return fmt.Errorf("stage %d: negative cost or bytes", i)
		}
		if c.TapeBytes[i] < c.ActBytes[i+1] {
			return fmt.Errorf("stage %d: tape of %d bytes is smaller than its output of %d", i, c.TapeBytes[i], c.ActBytes[i+1])
		}
	}
	for i, x := range c.ActBytes {
		if x < 0 {
			return fmt.Errorf("activation %d: negative bytes", i)
		}
	}
	if c.LossBackward < 0 || c.LossTempBytes < 0 {
		return errors.New("loss: negative cost or bytes")
	}
	return nil
}

// FAllTemp returns the transient bytes of F_all(i).
func (c *Chain) FAllTemp(i int) int64 {
	if c.FAllTempBytes == nil {
		return c.ForwardTempBytes[i]
	}
	return c.FAllTempBytes[i]
}

// Kind is the kind of a schedule op.
type Kind uint8

// The ops, named as in rotor.
const (
	FCk  Kind = iota // forward of stage i, keep the input a_i, keep nothing else
	FN               // forward of stage i, drop the input a_i
	FAll             // forward of stage i, keep the tape ā_{i+1}
	Loss             // the loss: a_L becomes δ_L
	B                // backward of stage i: δ_{i+1} becomes δ_i
)

var kindNames = [...]string{"F_ck", "F_n", "F_all", "loss", "B"}

func (k Kind) String() string { return kindNames[k] }

// ParseKind parses an op name as String writes it.
func ParseKind(s string) (Kind, bool) {
	for k, n := range kindNames {
		if n == s {
			return Kind(k), true
		}
	}
	return 0, false
}

// Op is one step of a schedule. Stage is the chain length L for Loss.
type Op struct {
	Kind  Kind
	Stage int
}

func (o Op) String() string { return fmt.Sprintf("%v(%d)", o.Kind, o.Stage) }

// Schedule is a sequence of ops that computes the forward and the whole
// backward of a chain.
type Schedule []Op

// ErrInfeasible reports a budget too small for any schedule a strategy can
// produce.
type ErrInfeasible struct {
	Budget    int64 // the budget asked for
	MinBudget int64 // the smallest budget that works, when known (else 0)
}

func (e *ErrInfeasible) Error() string {
	if e.MinBudget > 0 {
		return fmt.Sprintf("budget of %d bytes is too small: the smallest that works is %d bytes", e.Budget, e.MinBudget)
	}
	return fmt.Sprintf("budget of %d bytes is too small", e.Budget)
}
