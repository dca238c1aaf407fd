package planner

// Shortfall: why a setup does not fit, in the terms a user can change.
//
// "Needs at least 56 GiB" says how far off a setup is, not what to do.
// What to change depends on what fills the memory: static memory (the
// weights, their gradients, the optimizer state) does not shrink with
// the batch but does with LoRA, 8-bit optimizer state or sharding;
// activations and the loss's working memory shrink with the micro-batch
// and the sequence. Shortfall replays the strategy's schedule at the
// least budget it fits in and names the largest part of that least
// peak beyond static memory, and when it comes; or, where static memory
// alone passes the budget, its largest part.

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/mem"
	"github.com/ckptplan/ckptplan/solver"
)

// Shortfall is why a setup does not fit a budget: the least peak its
// strategy reaches and the largest part of it.
type Shortfall struct {
	BudgetBytes  mem.Bytes `json:"budget_bytes"`
	ReserveBytes mem.Bytes `json:"reserve_bytes,omitempty"`
	// StaticBytes is the static memory held at the least peak, or where
	// it alone passes the budget, all of it, the gradients included.
	StaticBytes mem.Bytes `json:"static_bytes"`
	// PageableBytes are the bytes of static memory a paged optimizer's
	// state lets the driver keep on the host, which NeedBytes leaves out
	// (Plan.PagedOutBytes).
	PageableBytes mem.Bytes `json:"pageable_bytes,omitempty"`
	// NeedBytes is the least budget the strategy fits in, the reserve
	// included; 0 where static memory alone passes the budget.
	NeedBytes mem.Bytes `json:"need_bytes,omitempty"`
	// At is when the least peak comes ("backward of head", "optimizer
	// step"); "" where static memory alone passes the budget.
	At string `json:"at,omitempty"`
	// Term is the largest part of what passes the budget: where static
	// memory alone does, its largest part ("weights", "gradients",
	// "optimizer state" or a costmodel.Term's name); otherwise the
	// largest part of the least peak beyond static memory
	// ("activations", "working memory", "gradients").
	Term      string    `json:"term"`
	TermBytes mem.Bytes `json:"term_bytes"`
	// Parts are what the least peak holds beyond static memory, the
	// largest first (Term is the first): activations, working memory,
	// gradients; none where static memory alone passes the budget.
	Parts []Part `json:"parts,omitempty"`
	// Stage keeps the largest tape of the chain, StageBytes, where the
	// term is activations: the head's logits, or a layer's.
	Stage      string    `json:"stage,omitempty"`
	StageBytes mem.Bytes `json:"stage_bytes,omitempty"`
	// Reason, where set, is why no plan was made at all: a size past
	// what int64 counts, or more microbatches than a pipeline orders.
	Reason string `json:"reason,omitempty"`
}

// Part is one part of a peak.
type Part struct {
	Name  string    `json:"name"`
	Bytes mem.Bytes `json:"bytes"`
}

// StaticPasses reports whether static memory alone passes the budget.
func (s *Shortfall) StaticPasses() bool { return s.NeedBytes == 0 }

// String says it in a line: "static memory 119.66 GiB passes the
// budget alone, most of it optimizer state (89.75 GiB)".
func (s *Shortfall) String() string {
	if s.Reason != "" {
		return s.Reason
	}
	if s.StaticPasses() {
		paged := ""
		if s.PageableBytes > 0 {
			paged = fmt.Sprintf(" even with %v of it, the optimizer's paged state, on the host;", s.PageableBytes)
		}
		return fmt.Sprintf("static memory %v passes the budget alone,%s most of it %s (%v)", s.StaticBytes, paged, s.Term, s.TermBytes)
	}
	return fmt.Sprintf("it needs at least %v; %s", s.NeedBytes, s.Beyond())
}

// Beyond says what the least peak holds, the parts beyond static memory
// largest first: "at the least peak, in the backward of head: static
// 20.13 GiB + working memory 37.09 GiB + activations 21.64 GiB +
// gradients 0 B".
func (s *Shortfall) Beyond() string {
	parts := []string{fmt.Sprintf("static %v", s.StaticBytes)}
	for _, p := range s.Parts {
		parts = append(parts, fmt.Sprintf("%s %v", p.Name, p.Bytes))
	}
	out := fmt.Sprintf("at the least peak, in the %s: %s", s.At, strings.Join(parts, " + "))
	if s.Stage != "" {
		out += fmt.Sprintf(" (%s keeps %v for its backward)", s.Stage, s.StageBytes)
	}
	return out
}

// Shortfall says why the problem does not fit the options' budget (or,
// where it does, what its least peak is made of).
func (p *Problem) Shortfall(o *Options) (*Shortfall, error) {
	opt, err := o.withDefaults()
	if err != nil {
		return nil, err
	}
	sf := &Shortfall{BudgetBytes: opt.Budget, ReserveBytes: opt.Reserve, StaticBytes: p.Static, PageableBytes: p.pageable}
	staticTerm := func() *Shortfall {
		sf.Term, sf.TermBytes = "static memory", p.Static
		if p.Costs != nil {
			term, bytes := p.Costs.Static.Largest()
			sf.Term, sf.TermBytes = term, mem.Bytes(bytes)
		}
		return sf
	}
	// The static memory a rank holds by the backward's end: the problem's
	// Static leaves out the gradients where the backward makes them.
	static := p.Static
	if p.Costs != nil {
		static = max(static, mem.Bytes(p.Costs.Static.Total()))
	}
	if static-p.pageable+opt.Reserve >= opt.Budget {
		sf.StaticBytes = static
		return staticTerm(), nil
	}
	sol, err := opt.Strategy.solve(p, opt.Budget-opt.Reserve-p.Static, &opt)
	var inf *solver.ErrInfeasible
	switch {
	case errors.As(err, &inf):
		if inf.MinBudget <= 0 {
			return staticTerm(), nil
		}
		if sol, err = opt.Strategy.solve(p, inf.MinBudget, &opt); err != nil {
			return nil, fmt.Errorf("%s at its least budget: %w", opt.Strategy.Name, err)
		}
	case err != nil:
		return nil, fmt.Errorf("%s: %w", opt.Strategy.Name, err)
	}
	sf.NeedBytes = p.paging(p.stepPeak(sol.Peak) + opt.Reserve)
	m := p.moment(sol.Schedule, sol.Result)
	if m == nil {
		sf.Term, sf.TermBytes = "activations", sol.Peak
		return sf, nil
	}
	sf.At, sf.StaticBytes = m.At, m.StaticBytes
	work := "working memory"
	if m.Step < 0 {
		work = "the optimizer step's working memory"
	}
	sf.Parts = []Part{{"activations", m.ActivationsBytes}, {work, m.TransientBytes}, {"gradients", m.GradientsBytes}}
	slices.SortStableFunc(sf.Parts, func(a, b Part) int { return cmp.Compare(b.Bytes, a.Bytes) })
	sf.Term, sf.TermBytes = sf.Parts[0].Name, sf.Parts[0].Bytes
	if sf.Term == "activations" && len(p.names) > 0 {
		k := 0
		for i, b := range p.Chain.TapeBytes {
			if b > p.Chain.TapeBytes[k] {
				k = i
			}
		}
		sf.Stage, sf.StageBytes = p.names[k], p.Chain.TapeBytes[k]
	}
	return sf, nil
}
