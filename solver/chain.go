package solver

import (
	"errors"
	"fmt"
	"slices"

	"github.com/ckptplan/ckptplan/mem"
)

// Chain is a sequence of L stages followed by a loss. Slices indexed by
// activation have L+1 entries (a_0 … a_L); slices indexed by stage have L.
type Chain struct {
	Forward  []float64 // cost of running stage i forward (any kind)
	Backward []float64 // cost of B(i)
	// ActBytes[i] is the size of activation a_i, and of its gradient δ_i.
	ActBytes []mem.Bytes
	// TapeBytes[i] is what F_all(i) keeps: everything B(i) needs besides
	// a_i, its output a_{i+1} included.
	TapeBytes        []mem.Bytes
	ForwardTempBytes []mem.Bytes // transient bytes during F_ck(i) and F_n(i)
	// FAllTempBytes are the transient bytes during F_all(i) beyond its
	// tape; nil means ForwardTempBytes.
	FAllTempBytes     []mem.Bytes
	BackwardTempBytes []mem.Bytes // transient bytes during B(i)
	// GradBytes[i] are the bytes of the parameter gradients B(i) makes,
	// which stay live to the end of the step (the optimizer reads them):
	// BackwardTempBytes[i] and every option's count them at their moment
	// within B(i) (where B(i) may have freed part of its tape, and δ_{i+1}
	// where its last op handed it on: never less than GradBytes[i] −
	// TapeBytes[i] − ActBytes[i+1]), and the gradient δ_i carried on counts them and those
	// of every later stage (DeltaBytes). Nil: gradients are not the
	// chain's (they are held the whole step, or there are none).
	GradBytes     []mem.Bytes
	LossBackward  float64   // cost of the loss op
	LossTempBytes mem.Bytes // transient bytes during the loss op
	// BackwardHeldBytes are held from the loss op to the end of the
	// backward, by every gradient δ_i (DeltaBytes), as buffers a runtime
	// allocates when the backward starts (ZeRO's reduce buckets);
	// LossTempBytes counts them during the loss op.
	BackwardHeldBytes mem.Bytes
	// HoldsLoss says that the training loop holds the loss a_L and its
	// gradient δ_L from the loss op to the end of the backward (the
	// caller holds the loss it calls backward on, autograd the gradient
	// it seeds the backward with): every gradient δ_i below δ_L counts
	// them (LossHeldBytes), as a_L and δ_L are themselves until B(L−1)
	// has run. False: they are freed then.
	HoldsLoss bool
	// UnsavedActs[i] says that no op of stage i-1 or stage i saves a_i
	// (a 16-bit layer's output, which the next layer's norm reads through
	// an fp32 copy): once a storing forward of stage i that keeps its
	// whole tape (option 0) has read it before the loss, the tape ā_i of
	// stage i-1 no longer holds it. A stage that keeps part of its tape,
	// or a checkpoint (and so a recomputation after the loss), keeps its
	// input. Nil, or false: a_i stays in ā_i until B(i-1). Indexed by
	// activation; a_0 and a_L are never freed so.
	UnsavedActs []bool
	// MakerUnsaved[i] says that no op of stage i-1 saves its output a_i:
	// once B(i) has run nothing reads a_i again, and the tape ā_i that
	// holds it frees it then (PyTorch frees a tensor with its last
	// reference); a storing forward of stage i-1 that runs after B(i) (a
	// recomputation, whose output nothing keeps) frees it once it has
	// run. Nil, or false: a_i stays in ā_i until B(i-1). Indexed by
	// activation; a_0 and a_L are never freed so. Simulate counts it; the
	// searches count a_i held, on the safe side.
	MakerUnsaved []bool
	// ArgBytes are what the model makes in its forward and hands the call
	// of every stage TakesArgs names (a decoder layer's: the positions,
	// eager attention's mask), which no op saves. They are live from the
	// first forward of the first such stage. Where every such stage's
	// first forward keeps its whole tape, they are freed after the last
	// one's; the call of one whose first forward keeps less (a
	// checkpoint, a keep set: torch.utils.checkpoint keeps its arguments
	// for the rerun) holds them to its backward. Simulate counts them so;
	// the searches count them held the whole step, on the safe side.
	ArgBytes  mem.Bytes
	TakesArgs []bool // indexed by stage; nil: none takes them
	// Embeds is what the model's forward holds in variables of its own
	// until it is past its layers: transformers' inputs_embeds, GPT-2's
	// position_embeds. Zero: nothing.
	Embeds Embeds
	// FAllInputFreedTempBytes[i] is FAllTempBytes[i] where F_all(i) frees
	// an unsaved a_i after its last reader (UnsavedActs): at least
	// −ActBytes[i]. Nil: FAllTempBytes (the input held to the end).
	FAllInputFreedTempBytes []mem.Bytes
	// Options[i] lists the other ways F_all(i) may run, each keeping part
	// of the tape and recomputing the rest in B(i); option 0 is the
	// chain's own tape, option k ≥ 1 is Options[i][k-1]. Nil: none.
	Options [][]Option
}

// Embeds is what the model's forward holds in variables of its own from
// stage 0's first forward until the first forward of stage Until has run
// (the last layer's: the model is past its layers), whatever the stages'
// ops save. Bytes are the embeddings' outputs stage 0 makes, keeps no
// copy of in its tape, and does not hand on (a scaled or summed one is
// a_1): live beside a_1. Act says that a_1 is itself such an output: an
// unsaved a_1 (UnsavedActs) stays in its tape ā_1 to then, where the
// first storing forward of stage 1 would free it. Simulate counts both;
// the searches count Bytes held the whole step, on the safe side.
type Embeds struct {
	Bytes mem.Bytes
	Act   bool
	Until int
}

// holds reports whether the model's forward holds anything (Embeds).
func (e Embeds) holds() bool { return e.Bytes > 0 || e.Act }

// Option is a variant of a storing forward: F_all(i) keeps a smaller tape
// and B(i) first recomputes what it dropped.
type Option struct {
	TapeBytes         mem.Bytes // what F_all(i) keeps, a_{i+1} included
	FAllTempBytes     mem.Bytes // transient bytes during F_all(i) beyond the tape
	Backward          float64   // cost of B(i), its recomputation included
	BackwardTempBytes mem.Bytes // transient bytes during B(i), the recomputed tensors included
	// Named: the option runs only where a schedule names it; the searches
	// (Optimal, its table, the pipeline's) pass it over. A runtime's own
	// policy is such an option: a plan runs it when asked for it.
	Named bool
	// RemakesOutput: B(i) reruns the op that makes a_{i+1}, into the
	// tape's a_{i+1}, which the tape therefore holds to B(i) whether or
	// not an op of stage i saves it (Chain.MakerUnsaved).
	RemakesOutput bool
}

// Unsaved reports whether a_i is saved by no op of the stages around it
// (UnsavedActs).
func (c *Chain) Unsaved(i int) bool {
	return i > 0 && i < c.Len() && c.UnsavedActs != nil && c.UnsavedActs[i]
}

// MakerUnsavedAt reports whether no op of stage i-1 saves a_i
// (MakerUnsaved).
func (c *Chain) MakerUnsavedAt(i int) bool {
	return i > 0 && i < c.Len() && c.MakerUnsaved != nil && c.MakerUnsaved[i]
}

// OutputLeavesTape reports whether a_i leaves the tape ā_i that option
// opt of stage i-1 keeps once B(i) has run: no op of stage i-1 saves it
// (MakerUnsaved) and B(i-1) under that option does not remake it
// (Option.RemakesOutput).
func (c *Chain) OutputLeavesTape(i, opt int) bool {
	return c.MakerUnsavedAt(i) && (opt == 0 || !c.Options[i-1][opt-1].RemakesOutput)
}

// TakesArgsAt reports whether stage i's call takes the model's call
// arguments (ArgBytes).
func (c *Chain) TakesArgsAt(i int) bool {
	return c.ArgBytes > 0 && c.TakesArgs != nil && c.TakesArgs[i]
}

// Len returns the number of stages L.
func (c *Chain) Len() int { return len(c.Forward) }

// ErrTooLarge is wrapped by Validate's errors for a chain whose sizes or
// costs pass what the solvers count exactly.
var ErrTooLarge = errors.New("too large to count")

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
	if c.Options != nil && len(c.Options) != l {
		return fmt.Errorf("chain has options for %d stages, not %d", len(c.Options), l)
	}
	if c.UnsavedActs != nil && len(c.UnsavedActs) != l+1 {
		return fmt.Errorf("chain has unsaved flags for %d activations, not %d", len(c.UnsavedActs), l+1)
	}
	if c.MakerUnsaved != nil && len(c.MakerUnsaved) != l+1 {
		return fmt.Errorf("chain has maker-unsaved flags for %d activations, not %d", len(c.MakerUnsaved), l+1)
	}
	if c.ArgBytes < 0 || c.TakesArgs != nil && len(c.TakesArgs) != l {
		return fmt.Errorf("chain has call arguments of %d bytes taken by %d stages, not %d", c.ArgBytes, len(c.TakesArgs), l)
	}
	if e := c.Embeds; e.Bytes < 0 || e.holds() && (e.Until < 1 || e.Until >= l) {
		return fmt.Errorf("chain holds %d bytes of embeddings to stage %d of %d", e.Bytes, e.Until, l)
	}
	if c.FAllInputFreedTempBytes != nil {
		if len(c.FAllInputFreedTempBytes) != l {
			return fmt.Errorf("chain has input-freed transients for %d stages, not %d", len(c.FAllInputFreedTempBytes), l)
		}
		for i, b := range c.FAllInputFreedTempBytes {
			if b < -c.ActBytes[i] {
				return fmt.Errorf("stage %d: a storing forward that frees its input frees more than it", i)
			}
		}
	}
	if c.GradBytes != nil && len(c.GradBytes) != l {
		return fmt.Errorf("chain has gradient bytes for %d stages, not %d", len(c.GradBytes), l)
	}
	for i, g := range c.GradBytes {
		if g < 0 {
			return fmt.Errorf("stage %d: negative gradient bytes", i)
		}
		// B(i) may free its tape and δ_{i+1} before it makes the
		// gradients, never more.
		if c.BackwardTempBytes[i]+c.TapeBytes[i]+c.ActBytes[i+1] < g {
			return fmt.Errorf("stage %d: its backward's %d transient bytes do not count the %d bytes of gradients it makes", i, c.BackwardTempBytes[i], g)
		}
		for k := 1; k < c.NumOptions(i); k++ {
			if o := c.Option(i, k); o.BackwardTempBytes+o.TapeBytes+c.ActBytes[i+1] < g {
				return fmt.Errorf("stage %d, option %d: its backward's transient bytes do not count the %d bytes of gradients it makes", i, k, g)
			}
		}
	}
	for i, opts := range c.Options {
		for k, o := range opts {
			if o.Backward < 0 || o.FAllTempBytes < 0 || o.BackwardTempBytes < 0 {
				return fmt.Errorf("stage %d, option %d: negative cost or bytes", i, k+1)
			}
			if o.TapeBytes < c.ActBytes[i+1] {
				return fmt.Errorf("stage %d, option %d: tape of %d bytes is smaller than its output of %d", i, k+1, o.TapeBytes, c.ActBytes[i+1])
			}
		}
	}
	for i, x := range c.ActBytes {
		if x < 0 {
			return fmt.Errorf("activation %d: negative bytes", i)
		}
	}
	if c.LossBackward < 0 || c.LossTempBytes < 0 || c.BackwardHeldBytes < 0 {
		return errors.New("loss: negative cost or bytes")
	}
	return c.checkTotals()
}

// checkTotals refuses a chain whose sizes or costs cannot be added up
// exactly: every schedule's peak is at most the sum of all its sizes, and
// its cost at most L times the sum of all costs, so bounding those sums
// (computed in float64, which cannot wrap) keeps every sum the solver
// makes within int64 and every cost finite.
func (c *Chain) checkTotals() error {
	var bytes, cost float64
	add := func(b mem.Bytes) { bytes += float64(b) }
	for _, b := range c.ActBytes {
		add(b)
	}
	for i := range c.Forward {
		add(c.TapeBytes[i])
		add(c.ForwardTempBytes[i])
		add(c.FAllTemp(i))
		add(c.BackwardTempBytes[i])
		worst := c.Backward[i]
		for k := 1; k < c.NumOptions(i); k++ {
			o := c.Option(i, k)
			add(o.TapeBytes)
			add(o.FAllTempBytes)
			add(o.BackwardTempBytes)
			worst = max(worst, o.Backward)
		}
		cost += c.Forward[i] + worst
	}
	for _, g := range c.GradBytes {
		add(g)
	}
	add(c.LossTempBytes)
	add(c.BackwardHeldBytes)
	add(c.LossHeldBytes())
	add(c.ArgBytes)
	cost += c.LossBackward
	if !(bytes < 1<<62) {
		return fmt.Errorf("chain sizes add up to %.3g bytes, past the 2^62 ckptplan can count exactly: %w", bytes, ErrTooLarge)
	}
	if !(cost*float64(c.Len()+1) < 1e300) {
		return fmt.Errorf("chain costs add up to %.3g, too large to compare (or not finite): %w", cost, ErrTooLarge)
	}
	return nil
}

// FAllTemp returns the transient bytes of F_all(i).
func (c *Chain) FAllTemp(i int) mem.Bytes {
	if c.FAllTempBytes == nil {
		return c.ForwardTempBytes[i]
	}
	return c.FAllTempBytes[i]
}

// DeltaBytes returns the bytes of the gradient δ_i while it is live:
// |a_i|, and with it the parameter gradients B(i) … B(L−1) have made
// (GradBytes), which are live whenever δ_i is, BackwardHeldBytes and
// LossHeldBytes. δ_L, the loss's, is |a_L| and BackwardHeldBytes. O(L).
func (c *Chain) DeltaBytes(i int) mem.Bytes { return c.deltas()[i] }

// LossHeldBytes returns what a δ_i below δ_L carries of the loss: a_L and
// δ_L's own |a_L| where the loop holds them (HoldsLoss), else 0.
func (c *Chain) LossHeldBytes() mem.Bytes {
	if !c.HoldsLoss {
		return 0
	}
	return 2 * c.ActBytes[c.Len()]
}

// deltas returns DeltaBytes(i) for i = 0 … L. O(L).
func (c *Chain) deltas() []mem.Bytes {
	d := slices.Clone(c.ActBytes)
	for k := range d {
		d[k] += c.BackwardHeldBytes
		if k < c.Len() {
			d[k] += c.LossHeldBytes()
		}
	}
	var g mem.Bytes
	for k := c.Len() - 1; k >= 0 && c.GradBytes != nil; k-- {
		g += c.GradBytes[k]
		d[k] += g
	}
	return d
}

// NumOptions returns how many ways F_all(i) may run: 1 plus its options.
func (c *Chain) NumOptions(i int) int {
	if c.Options == nil {
		return 1
	}
	return 1 + len(c.Options[i])
}

// Option returns option k of stage i; option 0 is the chain's own tape.
func (c *Chain) Option(i, k int) Option {
	if k == 0 {
		return Option{TapeBytes: c.TapeBytes[i], FAllTempBytes: c.FAllTemp(i), Backward: c.Backward[i], BackwardTempBytes: c.BackwardTempBytes[i]}
	}
	return c.Options[i][k-1]
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
// Option is which of the stage's options an F_all runs (0: its own tape);
// it is 0 for every other kind.
type Op struct {
	Kind   Kind
	Stage  int
	Option int
}

func (o Op) String() string {
	if o.Option != 0 {
		return fmt.Sprintf("%v(%d:%d)", o.Kind, o.Stage, o.Option)
	}
	return fmt.Sprintf("%v(%d)", o.Kind, o.Stage)
}

// Schedule is a sequence of ops that computes the forward and the whole
// backward of a chain.
type Schedule []Op

// ErrInfeasible reports a budget too small for any schedule a strategy can
// produce.
type ErrInfeasible struct {
	Budget    mem.Bytes // the budget asked for
	MinBudget mem.Bytes // the smallest budget that works, when known (else 0)
}

func (e *ErrInfeasible) Error() string {
	if e.MinBudget > 0 {
		return fmt.Sprintf("budget of %d bytes is too small: the smallest that works is %d bytes", e.Budget, e.MinBudget)
	}
	return fmt.Sprintf("budget of %d bytes is too small", e.Budget)
}
