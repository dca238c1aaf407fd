package solver

import (
	"fmt"

	"github.com/ckptplan/ckptplan/mem"
)

// Result is what Simulate measures of a schedule.
type Result struct {
	Cost float64
	Peak mem.Bytes
	// Timeline[k] is the most bytes live while op k runs or right after it,
	// transients included (the op's own peak).
	Timeline []mem.Bytes
	// Usage[k] splits Timeline[k] by kind.
	Usage []Usage
}

// Usage is what occupies memory at an op's peak.
type Usage struct {
	Activations mem.Bytes // standalone activations: a_0 and checkpoints
	Tapes       mem.Bytes // what storing forwards keep
	Gradients   mem.Bytes // δ and the loss it carries (Chain.HoldsLoss), the parameter gradients aside (ParamGrads)
	// ParamGrads are the parameter gradients the backwards have made so
	// far (Chain.GradBytes), and the buffers the backward holds for them
	// (Chain.BackwardHeldBytes).
	ParamGrads mem.Bytes
	Arguments  mem.Bytes // the model's call arguments (Chain.ArgBytes)
	Transient  mem.Bytes // the op's own working memory and new outputs
}

// state is the live set of a replay.
type state struct {
	c    *Chain
	act  []bool // standalone a_i
	ckpt []bool // a_i was kept by F_ck(i): it persists until B(i)
	tape []bool // ā_i (index i: the tape produced by stage i-1, containing a_i)
	opt  []int  // the option of stage i-1 that produced ā_i
	// read says a_i, unsaved, has left ā_i: stage i's storing forward
	// read it (Chain.UnsavedActs), or B(i) has run (Chain.MakerUnsaved).
	read     []bool
	backward bool // the loss has run: a storing forward now is a recomputation
	// ran says stage i has run its first forward; holds that its call
	// holds the call arguments (Chain.ArgBytes) to B(i), holding how many
	// do, and args where the arguments are: 0 not made, 1 live, 2 freed.
	ran, holds []bool
	holding    int
	args       int
	lastTaker  int // the last stage that takes the arguments, or -1
	// embeds says where Chain.Embeds are: 0 not made, 1 live, 2 freed;
	// keepsAct that a_1, unsaved, stays in its tape to then.
	embeds   int
	keepsAct bool
	delta    []bool
	dlt      []mem.Bytes // DeltaBytes
	live     mem.Bytes
	u        Usage // live bytes by kind, Transient unused
}

func (s *state) hasAct(i int) bool { return s.act[i] || i > 0 && s.tape[i] }

// Simulate replays a schedule op by op under the memory model of the
// package doc and returns its cost, its peak and the memory at each op.
// An op whose inputs are not live, a value computed twice while live, or a
// schedule that does not end with δ_0 computed is an error. O(len(s) + L).
//
// The rules: a_0 is live at the start. A forward of stage i needs a_i and
// peaks at live + |a_{i+1}| (|ā_{i+1}| for F_all) + its transients; F_n
// then frees a standalone a_i. Schedules are persistent: an activation kept
// by F_ck is a checkpoint until its backward, and F_n may not drop it. The loss needs a_L and peaks at live + its
// transients; B(i) needs a_i, δ_{i+1} and ā_{i+1} and peaks at live + its
// transients, then frees δ_{i+1} and ā_{i+1}. The gradient δ_i takes over
// the bytes of a standalone a_i, or is new bytes if a_i lives in a tape;
// the parameter gradients B(i) makes stay, and so do the loss and its
// gradient where the loop holds them (Chain.DeltaBytes).
// An F_all's option gives its tape and transients, and the cost and
// transients of the B(i) that consumes that tape. The model's call
// arguments are live as Chain.ArgBytes says, and the embeddings its
// forward holds as Chain.Embeds says.
func Simulate(c *Chain, sched Schedule) (Result, error) {
	return replay(c, sched, true)
}

// replay is Simulate; without timeline it leaves Result.Timeline and
// Result.Usage nil.
func replay(c *Chain, sched Schedule, timeline bool) (Result, error) {
	if err := c.Validate(); err != nil {
		return Result{}, err
	}
	l := c.Len()
	s := &state{c: c, act: make([]bool, l+1), ckpt: make([]bool, l+1), tape: make([]bool, l+1), opt: make([]int, l+1), read: make([]bool, l+1), delta: make([]bool, l+2), dlt: c.deltas(),
		ran: make([]bool, l), holds: make([]bool, l), lastTaker: -1}
	for i := range l {
		if c.TakesArgsAt(i) {
			s.lastTaker = i
		}
	}
	s.setAct(0, true)
	s.live = c.ActBytes[0]
	var r Result
	if timeline {
		r.Timeline = make([]mem.Bytes, len(sched))
		r.Usage = make([]Usage, len(sched))
	}
	r.Peak = s.live
	for k, op := range sched {
		s.makeArgs(op)
		before := s.u
		peak, cost, err := s.step(op)
		if err != nil {
			return Result{}, fmt.Errorf("op %d, %v: %w", k, op, err)
		}
		top := max(peak, s.live)
		r.Peak = max(r.Peak, top)
		r.Cost += cost
		if !timeline {
			continue
		}
		r.Timeline[k] = top
		u := before
		if after := s.u; s.live > peak {
			u = after
		}
		u.Transient = top - u.Activations - u.Tapes - u.Gradients - u.ParamGrads - u.Arguments
		r.Usage[k] = u
	}
	if !s.delta[0] {
		return Result{}, fmt.Errorf("schedule does not reach δ_0: the backward is incomplete")
	}
	return r, nil
}

func (s *state) step(op Op) (peak mem.Bytes, cost float64, err error) {
	c, l, i := s.c, s.c.Len(), op.Stage
	if op.Option != 0 && (op.Kind != FAll || i < 0 || i >= l || op.Option < 0 || op.Option >= c.NumOptions(i)) {
		return 0, 0, fmt.Errorf("no option %d for this op", op.Option)
	}
	switch op.Kind {
	case FCk, FN, FAll:
		if i < 0 || i >= l {
			return 0, 0, fmt.Errorf("no stage %d", i)
		}
		if !s.hasAct(i) {
			return 0, 0, fmt.Errorf("input a_%d is not live", i)
		}
		if s.act[i+1] || s.tape[i+1] {
			return 0, 0, fmt.Errorf("a_%d is already live", i+1)
		}
		if op.Kind == FN && s.ckpt[i] {
			return 0, 0, fmt.Errorf("a_%d is a checkpoint: it persists until B(%d), F_n may not drop it", i, i)
		}
		if op.Kind == FCk && s.act[i] {
			s.ckpt[i] = true
		}
		first := !s.backward && !s.ran[i]
		if first {
			s.ran[i] = true
			// A call that keeps less than its whole tape is a checkpoint's,
			// which holds its arguments to its backward.
			if c.TakesArgsAt(i) && (op.Kind != FAll || op.Option != 0) {
				s.holds[i] = true
				s.holding++
			}
		}
		// A storing forward before the loss frees an unsaved a_i from the
		// tape ā_i that holds it after its last reader. (A recomputation
		// in the backward is a checkpoint's, which holds its input.)
		frees := op.Kind == FAll && op.Option == 0 && !s.backward && c.Unsaved(i) && s.tape[i] && !s.read[i]
		// The model's forward holds an a_1 it made to its end (Embeds).
		if frees && i == 1 && c.Embeds.Act && s.embeds < 2 {
			frees, s.keepsAct = false, true
		}
		out, tmp := c.ActBytes[i+1], c.ForwardTempBytes[i]
		if op.Kind == FAll {
			o := c.Option(i, op.Option)
			out, tmp = o.TapeBytes, o.FAllTempBytes
		}
		if frees && c.FAllInputFreedTempBytes != nil {
			tmp = c.FAllInputFreedTempBytes[i]
		}
		peak = s.live + out + tmp
		s.live += out
		if op.Kind == FAll {
			s.setTape(i+1, true, op.Option)
		} else {
			s.setAct(i+1, true)
		}
		if op.Kind == FN && s.act[i] {
			s.setAct(i, false)
			s.live -= c.ActBytes[i]
		}
		if frees {
			s.leaveTape(i)
		}
		// A recomputation after B(i+1) keeps no a_{i+1} that its own
		// ops do not save.
		if op.Kind == FAll && s.delta[i+1] && c.OutputLeavesTape(i+1, op.Option) {
			s.leaveTape(i + 1)
		}
		// The model's forward is past its layers: no call holds the
		// arguments, and they go.
		if first && i == s.lastTaker && s.holding == 0 {
			s.freeArgs()
		}
		s.embed(i, first)
		return peak, c.Forward[i], nil
	case Loss:
		if i != l {
			return 0, 0, fmt.Errorf("the loss is stage %d", l)
		}
		if !s.hasAct(l) || s.delta[l] {
			return 0, 0, fmt.Errorf("the loss needs a_%d and runs once", l)
		}
		peak = s.live + c.LossTempBytes
		s.backward = true
		s.gradient(l)
		return peak, c.LossBackward, nil
	case B:
		if i < 0 || i >= l {
			return 0, 0, fmt.Errorf("no stage %d", i)
		}
		switch {
		case !s.delta[i+1]:
			return 0, 0, fmt.Errorf("δ_%d is not live", i+1)
		case !s.tape[i+1]:
			return 0, 0, fmt.Errorf("tape ā_%d is not live", i+1)
		case !s.hasAct(i):
			return 0, 0, fmt.Errorf("a_%d is not live", i)
		}
		o := c.Option(i, s.opt[i+1])
		peak = s.live + o.BackwardTempBytes
		s.setDelta(i+1, false)
		s.setTape(i+1, false, s.opt[i+1])
		s.live -= o.TapeBytes + s.dlt[i+1]
		if s.read[i+1] {
			s.read[i+1] = false
			s.u.Tapes += c.ActBytes[i+1]
			s.live += c.ActBytes[i+1]
		}
		s.gradient(i)
		// Nothing reads a_i now but the tape ā_i, when no op of stage
		// i-1 saves it.
		if s.tape[i] && !s.read[i] && c.OutputLeavesTape(i, s.opt[i]) {
			s.leaveTape(i)
		}
		if s.holds[i] {
			s.holds[i] = false
			if s.holding--; s.holding == 0 {
				s.freeArgs()
			}
		}
		return peak, o.Backward, nil
	}
	return 0, 0, fmt.Errorf("unknown op kind %d", op.Kind)
}

// makeArgs makes the call arguments live before the first forward of
// the first stage that takes them (Chain.ArgBytes).
func (s *state) makeArgs(op Op) {
	if s.args == 0 && !s.backward && op.Kind <= FAll && op.Stage >= 0 && op.Stage < s.c.Len() && s.c.TakesArgsAt(op.Stage) {
		s.args = 1
		s.u.Arguments += s.c.ArgBytes
		s.live += s.c.ArgBytes
	}
}

// embed makes Chain.Embeds live after stage 0's first forward, and
// frees them after stage Embeds.Until's.
func (s *state) embed(i int, first bool) {
	e := s.c.Embeds
	switch {
	case !first || !e.holds():
	case i == 0 && s.embeds == 0:
		s.embeds = 1
		s.u.Activations += e.Bytes
		s.live += e.Bytes
	case i == e.Until && s.embeds == 1:
		s.embeds = 2
		s.u.Activations -= e.Bytes
		s.live -= e.Bytes
		if s.keepsAct && s.tape[1] && !s.read[1] {
			s.leaveTape(1)
		}
		s.keepsAct = false
	}
}

// freeArgs frees the call arguments, once.
func (s *state) freeArgs() {
	if s.args == 1 {
		s.args = 2
		s.u.Arguments -= s.c.ArgBytes
		s.live -= s.c.ArgBytes
	}
}

// leaveTape frees a_i from the tape ā_i that holds it (read).
func (s *state) leaveTape(i int) {
	s.read[i] = true
	s.u.Tapes -= s.c.ActBytes[i]
	s.live -= s.c.ActBytes[i]
}

// sign returns +1 when a value becomes live, −1 when it is freed.
func sign(live bool) mem.Bytes {
	if live {
		return 1
	}
	return -1
}

// setAct makes a standalone a_i live or frees it, keeping s.u.
func (s *state) setAct(i int, live bool) {
	s.act[i] = live
	s.u.Activations += sign(live) * s.c.ActBytes[i]
}

// setTape makes the tape ā_i of option opt live or frees it, keeping s.u.
func (s *state) setTape(i int, live bool, opt int) {
	s.tape[i], s.opt[i] = live, opt
	s.u.Tapes += sign(live) * s.c.Option(i-1, opt).TapeBytes
}

// setDelta makes δ_i live or frees it, keeping s.u.
func (s *state) setDelta(i int, live bool) {
	s.delta[i] = live
	if i < len(s.c.ActBytes) {
		// The loss and its gradient a δ_i below δ_L carries
		// (Chain.HoldsLoss) are no parameter gradients.
		own := s.c.ActBytes[i]
		if i < s.c.Len() {
			own += s.c.LossHeldBytes()
		}
		s.u.Gradients += sign(live) * own
		s.u.ParamGrads += sign(live) * (s.dlt[i] - own)
	}
}

// gradient makes δ_i live, taking over a standalone a_i's bytes.
func (s *state) gradient(i int) {
	s.setDelta(i, true)
	s.live += s.dlt[i]
	if s.act[i] {
		s.setAct(i, false)
		s.ckpt[i] = false
		s.live -= s.c.ActBytes[i]
	}
}
