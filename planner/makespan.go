package planner

// A pipeline's step time is not the sum of its devices' work: a device
// waits for the activation its predecessor sends and for the gradient its
// successor sends back, and the schedule's ramp-up and drain leave every
// device idle part of the step, the bubble. Under 1F1B with forwards of
// time f and backwards of time b on every device, a step of m
// microbatches over p devices takes (m + p − 1)(f + b); the interleaved
// schedule's v chunks a device cut the bubble to (p − 1)(f + b)/v
// (Narayanan et al. 2021, §2.2). Recomputation lengthens a device's
// backwards, and a slower device stretches the whole pipeline.
//
// Makespan replays the schedule rather than trusting the formulas, so a
// device slower than the others, the head's loss, sends over a link and
// uneven splits are priced as they run: each device runs its order
// (Pipeline.Order) one op after another; a chunk's forward of a
// microbatch starts once the device is free and the previous model
// chunk's forward of the same microbatch has arrived (its finish plus the
// send), a backward once the next model chunk's backward has. A device is
// woken only when an op it may wait on finishes, so the replay takes time
// linear in the ops, and holds only the arrivals not yet consumed: each
// model chunk runs its microbatches in order, so arrivals are queues.

import (
	"fmt"
	"slices"
)

// Makespan returns the time one step of the pipeline's schedule takes
// from the first forward to the last backward: fwd[rank][c] and
// bwd[rank][c] are the times of one microbatch's forward and backward of
// device rank's chunk c (model chunk c·p + rank), send[g] the time the
// output of model chunk g takes to reach chunk g+1, and its gradient to
// come back. The pipeline is one a plan records (its Virtual filled in).
func (pp Pipeline) Makespan(fwd, bwd [][]float64, send []float64) (float64, error) {
	ends, err := pp.ends(fwd, bwd, send)
	if err != nil {
		return 0, err
	}
	return slices.Max(ends), nil
}

// ends returns when each device of the pipeline finishes its last op, as
// Makespan replays the schedule.
func (pp Pipeline) ends(fwd, bwd [][]float64, send []float64) ([]float64, error) {
	p, v := pp.Stages, pp.Virtual
	chunks := p * v
	if len(fwd) != p || len(bwd) != p || len(send) != chunks-1 {
		return nil, fmt.Errorf("makespan of %d stages × %d chunks: %d forward and %d backward devices, %d sends", p, v, len(fwd), len(bwd), len(send))
	}
	for k := range p {
		if len(fwd[k]) != v || len(bwd[k]) != v {
			return nil, fmt.Errorf("makespan: device %d has %d forward and %d backward chunk times, want %d", k, len(fwd[k]), len(bwd[k]), v)
		}
	}
	type arrival struct {
		micro int
		at    float64
	}
	// ahead[g]: model chunk g's forwards not yet taken by chunk g+1;
	// back[g]: its backwards not yet taken by chunk g−1.
	ahead, back := make([][]arrival, chunks), make([][]arrival, chunks)
	next := make([]int, p)         // each device's next op
	free := make([]float64, p)     // when each device is free
	warmup := make([]int, p)       // each device's forwards before its first backward
	queued := make([]bool, p)      // on the work list
	work := make([]int, 0, p)      // devices that may run on
	ops := 2 * pp.Microbatches * v // each device's
	for k := range p {
		warmup[k] = pp.warmup(k)
		work, queued[k] = append(work, k), true
	}
	wake := func(k int) {
		if !queued[k] {
			work, queued[k] = append(work, k), true
		}
	}
	for len(work) > 0 {
		k := work[len(work)-1]
		work, queued[k] = work[:len(work)-1], false
		for ; next[k] < ops; next[k]++ {
			op := pp.opAt(k, warmup[k], next[k])
			g := op.Chunk*p + k
			start, took := free[k], fwd[k][op.Chunk]
			from, wait := -1, ahead // the queue op waits on, if any
			if op.Forward && g > 0 {
				from = g - 1
			}
			if !op.Forward {
				took, wait = bwd[k][op.Chunk], back
				if g < chunks-1 {
					from = g + 1
				}
			}
			if from >= 0 {
				q := wait[from]
				if len(q) == 0 {
					break // woken when it arrives
				}
				if q[0].micro != op.Micro {
					return nil, fmt.Errorf("makespan: device %d runs microbatch %d of chunk %d before %d", k, op.Micro, g, q[0].micro)
				}
				start = max(start, q[0].at+send[min(from, g)])
				wait[from] = q[1:]
			}
			free[k] = start + took
			switch {
			case op.Forward && g < chunks-1:
				ahead[g] = append(ahead[g], arrival{op.Micro, free[k]})
				wake((g + 1) % p)
			case !op.Forward && g > 0:
				back[g] = append(back[g], arrival{op.Micro, free[k]})
				wake((g - 1) % p)
			}
		}
	}
	for k := range p {
		if next[k] < ops {
			return nil, fmt.Errorf("makespan: device %d stalls at op %d of %d", k, next[k], ops)
		}
	}
	return free, nil
}

// pipelineTimes are a pipeline's times in TimeUnit, for its step's:
// each device's chunks' forward and backward a microbatch, the backward
// under the plan (bwd) and storing everything (stored), the sends
// between model chunks, each device's optimizer step and data-parallel
// collectives (nil: none), and the all-reduces of tied weights'
// gradients between the devices that hold their copies.
type pipelineTimes struct {
	pp               Pipeline
	fwd, bwd, stored [][]float64
	send             []float64
	update           []float64
	comm             []*Comm
	tied             []tiedReduce
}

// tiedReduce is the all-reduce of a tied weight's gradients between the
// two devices that hold its copies (Megatron-LM's word embeddings on the
// first and last stages, _allreduce_word_embedding_grads): once both
// have ended their backwards and reduced their data-parallel gradients,
// before the step.
type tiedReduce struct {
	a, b int     // the devices
	time float64 // in TimeUnit
}

func newPipelineTimes(pp Pipeline) *pipelineTimes {
	t := &pipelineTimes{pp: pp, send: make([]float64, pp.Stages*pp.Virtual-1), update: make([]float64, pp.Stages), comm: make([]*Comm, pp.Stages)}
	for range pp.Stages {
		t.fwd = append(t.fwd, make([]float64, pp.Virtual))
		t.bwd = append(t.bwd, make([]float64, pp.Virtual))
		t.stored = append(t.stored, make([]float64, pp.Virtual))
	}
	return t
}

// step returns the step's time under the plan and storing everything,
// and what of the plan's the data-parallel collectives and the tied
// weights' all-reduces add.
func (t *pipelineTimes) step() (cost, baseline, comm, tied float64, err error) {
	if cost, err = t.stepOf(t.bwd, t.comm, t.tied); err != nil {
		return 0, 0, 0, 0, err
	}
	if baseline, err = t.stepOf(t.stored, t.comm, t.tied); err != nil {
		return 0, 0, 0, 0, err
	}
	if slices.ContainsFunc(t.comm, func(c *Comm) bool { return c != nil }) {
		alone, err := t.stepOf(t.bwd, make([]*Comm, len(t.comm)), t.tied)
		if err != nil {
			return 0, 0, 0, 0, err
		}
		comm = cost - alone
	}
	if len(t.tied) > 0 {
		untied, err := t.stepOf(t.bwd, t.comm, nil)
		if err != nil {
			return 0, 0, 0, 0, err
		}
		tied = cost - untied
	}
	return cost, baseline, comm, tied, nil
}

// stepOf returns the step's time with backwards bwd and collectives comm:
// what a device's collectives do not hide of each microbatch (as
// Comm.Exposed counts it) lengthens its backwards, in proportion to
// their times, and what they leave of the last follows its last op; the
// devices then step together (clipping the gradients' norm waits for
// every one), each updating its weights and gathering them again. A tied
// weight's all-reduce starts once both its devices are done and ends
// before the step.
func (t *pipelineTimes) stepOf(bwd [][]float64, comm []*Comm, tied []tiedReduce) (float64, error) {
	slow := slices.Clone(bwd)
	last := make([]float64, len(bwd))
	for k, c := range comm {
		if c == nil {
			continue
		}
		var micro, back float64
		for j := range bwd[k] {
			micro += t.fwd[k][j] + bwd[k][j]
			back += bwd[k][j]
		}
		each, end := c.perMicro(micro, back)
		last[k] = end
		if each == 0 {
			continue
		}
		slow[k] = slices.Clone(bwd[k])
		for j, b := range bwd[k] {
			switch {
			case back > 0:
				slow[k][j] += each * b / back
			case j == 0:
				slow[k][j] += each
			}
		}
	}
	ends, err := t.pp.ends(t.fwd, slow, t.send)
	if err != nil {
		return 0, err
	}
	var flushed, stepped float64
	for _, r := range tied {
		flushed = max(flushed, max(ends[r.a]+last[r.a], ends[r.b]+last[r.b])+r.time)
	}
	for k, e := range ends {
		flushed = max(flushed, e+last[k])
		after := 0.0
		if comm[k] != nil {
			after = comm[k].AfterStep
		}
		stepped = max(stepped, t.update[k]+after)
	}
	return flushed + stepped, nil
}
