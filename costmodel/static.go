package costmodel

import "github.com/ckptplan/ckptplan/ir"

// Static is the memory that does not depend on the schedule.
type Static struct {
	WeightsBytes   int64
	GradientsBytes int64
	OptimizerBytes int64
}

func staticMemory(g *ir.Graph) (Static, error) { return Static{}, nil }
