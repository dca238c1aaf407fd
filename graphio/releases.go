package graphio

// What each transformers release runs.
//
// The same model keeps other tensors on other transformers releases: the
// attention path changed in 4.48 (one shared sdpa function, handed
// contiguous copies of q, k and v), 4.53 (the model makes every layer's
// mask, and under sdpa a causal layer gets none), 4.54 (K and V go to
// sdpa unexpanded, with enable_gqa, where there is no mask), 4.56 (the
// contiguous copies dropped again) and in 5.2 and 5.4 (GPT-2's eager
// attention became Llama's; Gemma's embedding scale a buffer); GPT-2
// took the shared causal LM loss, which upcasts the logits, in 4.48, and
// that loss stopped copying the shifted logits in 4.49. Each of those
// changes what autograd saves, so the transformers profile plans for one
// release, named in the setup
// (training.transformers, --transformers), and this table is the one place
// that says what a release does: every rule is a field of ir.Numerics,
// which the builders read. A release between two rows runs as the older
// row says; a release newer than Newest runs as the newest row says, and
// the command says it was not verified.
//
// The rows are read off transformers' own code (integrations/
// sdpa_attention.py, masking_utils.py, integrations/moe.py,
// models/*/modeling_*.py) at
// each release; Verified are the releases the Python tests measure every
// family on.

import (
	"fmt"
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
)

// Release is a transformers version, major.minor (a patch release runs as
// its minor release).
type Release struct{ Major, Minor int }

func (r Release) String() string { return fmt.Sprintf("%d.%d", r.Major, r.Minor) }

// Less reports whether r is older than o.
func (r Release) Less(o Release) bool {
	return r.Major < o.Major || r.Major == o.Major && r.Minor < o.Minor
}

// releaseRules is what the releases from one on run.
type releaseRules struct {
	from                                Release
	sdpaContiguous, sdpaGQA, modelMasks bool
	gpt2AdditiveMask, gpt2FloatScale    bool
	gpt2LossModelDType, phi3AttnOutputs bool
	gemmaScaleBuffer                    bool
	phi3RopeCat                         bool
	// lossShiftCopy: the causal LM loss shifts the logits by a
	// contiguous copy (before 4.49).
	lossShiftCopy bool
	// softcapEager: a model whose attention soft-caps its scores
	// (Gemma 2) has no sdpa attention, only eager and flash.
	softcapEager bool
	// expertsKernels: mixtures of experts run through transformers'
	// experts implementations (grouped_mm by default), which the
	// builders do not model (a trace of the model follows them).
	expertsKernels bool
}

var releases = []releaseRules{
	{from: Release{4, 46}, lossShiftCopy: true, gpt2LossModelDType: true, phi3AttnOutputs: true},
	{from: Release{4, 48}, sdpaContiguous: true, phi3RopeCat: true, lossShiftCopy: true},
	{from: Release{4, 49}, sdpaContiguous: true, phi3RopeCat: true},
	{from: Release{4, 53}, sdpaContiguous: true, phi3RopeCat: true, modelMasks: true},
	{from: Release{4, 54}, sdpaContiguous: true, phi3RopeCat: true, modelMasks: true, sdpaGQA: true},
	{from: Release{4, 56}, phi3RopeCat: true, modelMasks: true, sdpaGQA: true},
	{from: Release{5, 0}, phi3RopeCat: true, modelMasks: true, sdpaGQA: true, expertsKernels: true},
	{from: Release{5, 2}, phi3RopeCat: true, modelMasks: true, sdpaGQA: true, expertsKernels: true, gpt2AdditiveMask: true},
	{from: Release{5, 4}, phi3RopeCat: true, modelMasks: true, sdpaGQA: true, expertsKernels: true, gpt2AdditiveMask: true, gpt2FloatScale: true, gemmaScaleBuffer: true},
	{from: Release{5, 21}, phi3RopeCat: true, modelMasks: true, sdpaGQA: true, expertsKernels: true, gpt2AdditiveMask: true, gpt2FloatScale: true, gemmaScaleBuffer: true, softcapEager: true},
}

var (
	// Oldest is the oldest transformers release ckptplan plans for.
	Oldest = Release{4, 46}
	// Newest is the newest release verified, and the default.
	Newest = Release{5, 24}
	// NewestExperts is the newest release whose mixtures of experts
	// ckptplan models, and their default.
	NewestExperts = Release{4, 57}
	// Verified are the releases whose every family the Python tests
	// measure (python/requirements-*.txt pin them).
	Verified = []string{"4.46.3", "4.57.6", "5.24.0"}
)

// ParseRelease reads a transformers version: "5.24", "4.46.3",
// "4.57.0.dev0". It is an error below Oldest.
func ParseRelease(s string) (Release, error) {
	parts := strings.SplitN(strings.TrimSpace(s), ".", 3)
	if len(parts) < 2 {
		return Release{}, fmt.Errorf("transformers version %q: want major.minor, such as %s", s, Newest)
	}
	var r Release
	var err error
	if r.Major, err = strconv.Atoi(parts[0]); err != nil || r.Major < 0 {
		return Release{}, fmt.Errorf("transformers version %q: want major.minor, such as %s", s, Newest)
	}
	minor := parts[1]
	if i := strings.IndexFunc(minor, func(c rune) bool { return c < '0' || c > '9' }); i >= 0 {
		minor = minor[:i] // 4.57rc1
	}
	if r.Minor, err = strconv.Atoi(minor); err != nil || r.Minor < 0 {
		return Release{}, fmt.Errorf("transformers version %q: want major.minor, such as %s", s, Newest)
	}
	if r.Less(Oldest) {
		return Release{}, fmt.Errorf("transformers %s is older than the oldest ckptplan plans for, %s (its numerics can be given with --sdpa-layout and the other numerics flags)", s, Oldest)
	}
	return r, nil
}

// rulesOf returns what release r runs: the newest row from r or before.
func rulesOf(r Release) releaseRules {
	rules := releases[0]
	for _, row := range releases {
		if !r.Less(row.from) {
			rules = row
		}
	}
	return rules
}

// ApplyRelease sets t to plan for transformers release r: its version and
// the numerics that release decides.
func ApplyRelease(t *ir.Setup, r Release) {
	rules := rulesOf(r)
	t.Transformers = r.String()
	n := &t.Numerics
	n.SDPAContiguous, n.SDPAGQA, n.ModelMasks = rules.sdpaContiguous, rules.sdpaGQA, rules.modelMasks
	n.GPT2AdditiveMask, n.GPT2FloatScale = rules.gpt2AdditiveMask, rules.gpt2FloatScale
	n.GPT2LossModelDType, n.Phi3AttnOutputs = rules.gpt2LossModelDType, rules.phi3AttnOutputs
	n.GemmaScaleBuffer = rules.gemmaScaleBuffer
	n.Phi3RopeCat = rules.phi3RopeCat
	n.LossShiftCopy = rules.lossShiftCopy
}

// traceFieldError is a field's error of the kind ErrNeedsTrace; errors.As
// finds its ir.FieldError.
type traceFieldError struct{ ir.FieldError }

func (e *traceFieldError) Unwrap() error { return ErrNeedsTrace }

func (e *traceFieldError) As(target any) bool {
	if t, ok := target.(**ir.FieldError); ok {
		*t = &e.FieldError
		return true
	}
	return false
}

// checkRelease reports what model m's setup asks of its transformers
// release that the release does not run.
func (m *Model) checkRelease() error {
	t := &m.Training
	if t.Profile != ir.ProfileTransformers || t.Transformers == "" {
		return nil
	}
	r, err := ParseRelease(t.Transformers)
	if err != nil {
		return fe("training.transformers", "%v", err)
	}
	if m.Experts > 0 && rulesOf(r).expertsKernels {
		return &traceFieldError{ir.FieldError{Field: "experts", Msg: fmt.Sprintf("transformers %s runs a mixture of experts through its experts implementations (grouped_mm, from 5.0), which ckptplan's builders do not model: trace the model ('ckptplan trace CONFIG', which follows them) and plan the trace, or plan it as transformers 4.57 runs it (--transformers 4.57)", t.Transformers)}}
	}
	if m.AttnSoftcap > 0 && (t.Attention == ir.AttentionSDPA || t.Attention == ir.AttentionSDPAMath) && rulesOf(r).softcapEager {
		return fe("training.attention", "transformers %s runs no sdpa attention for %s, whose attention soft-caps its scores (from 5.21): plan eager or flash attention", t.Transformers, m.Family)
	}
	return nil
}
