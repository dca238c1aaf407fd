package solver

// StoreAll returns the schedule that keeps every tape: F_all of every
// stage, the loss, then every backward. It has the least cost of all
// schedules and the largest memory.
func StoreAll(c *Chain) Schedule { return StoreAllWith(c, nil) }

// StoreAllWith is StoreAll with F_all(i) running option options[i] (nil:
// every option 0).
func StoreAllWith(c *Chain, options []int) Schedule {
	l := c.Len()
	s := make(Schedule, 0, 2*l+1)
	for i := 0; i < l; i++ {
		o := 0
		if options != nil {
			o = options[i]
		}
		s = append(s, Op{Kind: FAll, Stage: i, Option: o})
	}
	s = append(s, Op{Kind: Loss, Stage: l})
	for i := l - 1; i >= 0; i-- {
		s = append(s, Op{Kind: B, Stage: i})
	}
	return s
}

// Segments returns the schedule that keeps the input of each segment as a
// checkpoint in the first forward pass and recomputes a segment with tapes
// right before its backward. starts lists the first stage of every segment
// in increasing order, beginning with 0. The last segment keeps its tapes
// in the first pass (recomputing it would change nothing), as
// torch.utils.checkpoint_sequential does.
func Segments(c *Chain, starts []int) Schedule {
	l := c.Len()
	ends := append(append([]int(nil), starts[1:]...), l)
	var s Schedule
	last := len(starts) - 1
	for k := 0; k < last; k++ {
		s = append(s, Op{Kind: FCk, Stage: starts[k]})
		for i := starts[k] + 1; i < ends[k]; i++ {
			s = append(s, Op{Kind: FN, Stage: i})
		}
	}
	for k := last; k >= 0; k-- {
		for i := starts[k]; i < ends[k]; i++ {
			s = append(s, Op{Kind: FAll, Stage: i})
		}
		if k == last {
			s = append(s, Op{Kind: Loss, Stage: l})
		}
		for i := ends[k] - 1; i >= starts[k]; i-- {
			s = append(s, Op{Kind: B, Stage: i})
		}
	}
	return s
}

// EveryK checkpoints the input of every k-th stage (k = 1 is per-layer
// checkpointing as Hugging Face's gradient_checkpointing_enable does).
func EveryK(c *Chain, k int) Schedule {
	k = max(k, 1)
	var starts []int
	for i := 0; i < c.Len(); i += k {
		starts = append(starts, i)
	}
	return Segments(c, starts)
}

// PerStage returns the schedule a runtime that handles each stage on its
// own runs (a trainer's per-layer checkpointing): stage i's forward keeps
// its tape under option options[i] (nil: every option 0), or only its
// input when checkpointed[i]; after the loss, each checkpointed stage
// reruns keeping its tape right before its backward.
func PerStage(checkpointed []bool, options []int) Schedule {
	l := len(checkpointed)
	s := make(Schedule, 0, 2*l+1)
	for i := 0; i < l; i++ {
		switch {
		case checkpointed[i]:
			s = append(s, Op{Kind: FCk, Stage: i})
		case options != nil:
			s = append(s, Op{Kind: FAll, Stage: i, Option: options[i]})
		default:
			s = append(s, Op{Kind: FAll, Stage: i})
		}
	}
	s = append(s, Op{Kind: Loss, Stage: l})
	for i := l - 1; i >= 0; i-- {
		if checkpointed[i] {
			s = append(s, Op{Kind: FAll, Stage: i})
		}
		s = append(s, Op{Kind: B, Stage: i})
	}
	return s
}
