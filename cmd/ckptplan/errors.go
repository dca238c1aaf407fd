package main

import (
	"encoding/json"
	"errors"
	"io"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/planner"
)

// errorsEnv, set to "json", makes the command follow its error message,
// when it fails, with the error as one JSON object (errorReport) on the
// last line of standard error: what a program calling the command (the
// Python package) reads instead of parsing the text.
const errorsEnv = "CKPTPLAN_ERRORS"

// errorReport is a failure as a program reads it.
type errorReport struct {
	// Kind is what went wrong: usage (the command line: exit status 2),
	// infeasible (the plan does not fit its budget), needs_trace (a
	// model ckptplan builds no graph of as the setup runs it, which a
	// trace of it plans: graphio.ErrNeedsTrace), input (another file, a
	// model or a setting the command cannot use) or internal (a bug).
	Kind    string `json:"kind"`
	Message string `json:"message"` // as the text line says it, without "ckptplan: "
	// MinBudgetBytes is, for infeasible, the least budget that fits (0
	// when static memory alone passes the budget).
	MinBudgetBytes int64 `json:"min_budget_bytes,omitempty"`
	// File, Line and Column place an input error, where it has a place.
	File   string `json:"file,omitempty"`
	Line   int    `json:"line,omitempty"`
	Column int    `json:"column,omitempty"`
}

// infeasibleError is a plan that does not fit its budget.
type infeasibleError struct {
	msg            string
	minBudgetBytes int64 // 0: static memory alone passes the budget
}

func (e *infeasibleError) Error() string { return e.msg }

// reportOf classifies err for errorReport.
func reportOf(err error) errorReport {
	r := errorReport{Kind: "input", Message: err.Error()}
	var u *usageError
	var inf *infeasibleError
	var over *planner.RuntimeOverBudget
	var pos *graphio.PosError
	switch {
	case errors.As(err, &u) || errors.Is(err, errUsageShown):
		r.Kind = "usage"
	case errors.As(err, &inf):
		r.Kind, r.MinBudgetBytes = "infeasible", inf.minBudgetBytes
	case errors.As(err, &over):
		r.Kind, r.MinBudgetBytes = "infeasible", int64(over.MinBudget)
	}
	if errors.Is(err, graphio.ErrNeedsTrace) {
		r.Kind = "needs_trace"
	}
	if errors.As(err, &pos) {
		r.File, r.Line, r.Column = pos.File, pos.Line, pos.Col
	}
	return r
}

// writeErrorReport writes r as one line of JSON.
func writeErrorReport(w io.Writer, r errorReport) {
	data, err := json.Marshal(r)
	if err != nil {
		return
	}
	w.Write(append(data, '\n'))
}
