package export

import (
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/planner"
)

var hfTarget = &Target{Name: "hf", Help: "transformers calls", Closest: hfWhole,
	Write: func(w io.Writer, e *Export, s *Setting, _ string) ([]string, error) { return nil, e.HF(w, s) }}

// hfWhole is the hf target's Closest: transformers' checkpointing runs
// whole layers, so where the plan keeps part of a layer, the best plan of
// whole layers (the optimal solver's, layer by layer), if one fits.
func hfWhole(e *Export, p *planner.Problem, opt *planner.Options) (*Setting, error) {
	if len(e.indexes(ModeSelective)) == 0 {
		return nil, nil
	}
	o := *opt
	o.Strategy = planner.Optimal
	plan, err := p.Plan(&o)
	if err != nil || !plan.Feasible {
		return nil, nil // the plan's layers, checkpointed whole
	}
	return &Setting{Plan: plan, At: -1}, nil
}

// HF writes the calls that make a Hugging Face model checkpoint the plan's
// layers. gradient_checkpointing_enable turns checkpointing on for every
// decoder layer; layers derived from GradientCheckpointingLayer then read
// their own gradient_checkpointing flag, which the loop sets per layer.
// Gradient checkpointing has no partial keep: where the plan keeps part
// of a layer, HF writes whole (a plan of whole layers, hfWhole's) where
// it costs no more than checkpointing those layers whole, else the plan
// with them checkpointed; the output says which, and what it costs.
func (e *Export) HF(w io.Writer, whole *Setting) error {
	if whole != nil && whole.Plan != nil {
		alt, err := FromPlan(whole.Plan)
		if err != nil {
			return err
		}
		if rerun, known := e.hfRerun(); !known || alt.Overhead <= rerun/e.baseline {
			return alt.hf(w, fmt.Sprintf("# The plan (%s, %+.1f%% compute) keeps part of layers %s, which transformers' checkpointing\n"+
				"# cannot: this is the cheapest plan of whole layers in its budget, %+.1f%% compute, peak %v.\n"+
				"# ckptplan.apply(model, plan) in Python, or ckptplan export --to pytorch, runs the plan itself.\n",
				e.Solver, 100*e.Overhead, spans(e.indexes(ModeSelective), ""), 100*alt.Overhead, alt.PeakBytes))
		}
	}
	return e.hf(w, "")
}

// hfRerun returns the FLOPs the plan's layers recompute with its
// selective layers checkpointed whole, where they are known.
func (e *Export) hfRerun() (float64, bool) {
	if len(e.wholeRerun) != len(e.Layers) || e.baseline <= 0 {
		return 0, false
	}
	var rerun float64
	for i, l := range e.Layers {
		switch l.Mode {
		case ModeCheckpoint:
			rerun += l.RecomputeFLOPs
		case ModeSelective:
			rerun += e.wholeRerun[i]
		}
	}
	return rerun, true
}

// hf writes e's calls, header (comment lines) first after the title.
func (e *Export) hf(w io.Writer, header string) error {
	ckpt := append(e.indexes(ModeCheckpoint), e.indexes(ModeSelective)...)
	slices.Sort(ckpt)
	var b strings.Builder
	b.WriteString(sourceHeader)
	fmt.Fprintf(&b, "# The activation plan of %s for Hugging Face transformers, made by ckptplan.\n", comment(e.Model))
	b.WriteString(header)
	if len(ckpt) == 0 {
		b.WriteString("# The plan stores every layer: leave gradient checkpointing off.\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	if len(ckpt) == len(e.Layers) {
		b.WriteString("# Checkpoint every layer.\n")
	} else {
		fmt.Fprintf(&b, "# Checkpoint layers %s; store the others.\n", spans(ckpt, ""))
	}
	if sel := e.indexes(ModeSelective); len(sel) > 0 {
		fmt.Fprintf(&b, "# Layers %s keep part of their tensors in the plan; gradient checkpointing cannot,\n# so they are checkpointed whole here: ", spans(sel, ""))
		if rerun, known := e.hfRerun(); known {
			fmt.Fprintf(&b, "this runtime recomputes %.4g FLOPs, %+.1f%% compute where the\n# plan's runtime pays %+.1f%%, and", rerun, 100*rerun/e.baseline, 100*e.Overhead)
		} else {
			b.WriteString("more compute than the plan's runtime, and")
		}
		// Checkpointed whole, a layer holds less than kept in part, and the
		// same in its backward: no more than the plan run layer by layer.
		b.WriteString(" holds no more than the plan run layer by layer")
		if e.RuntimePeakBytes > 0 {
			fmt.Fprintf(&b, " (%v)", e.RuntimePeakBytes)
		}
		b.WriteString(". ckptplan.apply(model, plan)\n# in Python, or ckptplan export --to pytorch, keeps them as planned.\n")
	}
	for _, n := range e.Notes {
		fmt.Fprintf(&b, "# Note: %s.\n", comment(n))
	}
	if e.Autocast != "" {
		b.WriteString("# Note: under torch.autocast the checkpointed layers' 16-bit weight copies stay in autocast's\n" +
			"# cache until the forward ends, above the plan's peak; ckptplan.apply clears it around each layer.\n")
	}
	// Non-reentrant checkpointing needs no input that requires a gradient,
	// so a PEFT model's frozen embeddings need no enable_input_require_grads.
	b.WriteString("# Non-reentrant, as PEFT models need (their frozen embeddings need no enable_input_require_grads).\n")
	if len(ckpt) < len(e.Layers) {
		b.WriteString("# Per-layer control needs transformers 4.52 or later, whose decoder layers each read their\n" +
			"# gradient_checkpointing flag; before, gradient_checkpointing_enable checkpoints every layer.\n")
		b.WriteString("try:\n    from transformers.modeling_layers import GradientCheckpointingLayer\n" +
			"except ImportError:\n    raise ImportError(\"this plan checkpoints some layers and stores others, which needs \"\n" +
			"                      \"transformers >= 4.52: use ckptplan.apply(model, plan), or ckptplan export --to pytorch\") from None\n")
	}
	// transformers 5.23 renamed gradient_checkpointing_enable, which
	// stays a deprecated alias until 6.
	b.WriteString("if hasattr(model, \"activation_checkpointing_enable\"):  # transformers 5.23 and later\n" +
		"    model.activation_checkpointing_enable(activation_checkpointing_kwargs={\"use_reentrant\": False})\n" +
		"else:\n" +
		"    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={\"use_reentrant\": False})\n")
	if len(ckpt) < len(e.Layers) {
		fmt.Fprintf(&b, "CHECKPOINTED = {%s}\n", ints(ckpt))
		b.WriteString("base = model.get_base_model() if hasattr(model, \"get_base_model\") else model  # PEFT\n")
		b.WriteString("for i, layer in enumerate(base.model.layers):  # GPT-2: base.transformer.h\n")
		b.WriteString("    assert isinstance(layer, GradientCheckpointingLayer), type(layer)\n")
		b.WriteString("    layer.gradient_checkpointing = i in CHECKPOINTED\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}
