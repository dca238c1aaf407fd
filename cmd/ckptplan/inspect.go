package main

import (
	"encoding/json"
	"fmt"
	"io"
	"sort"
	"strings"
	"text/tabwriter"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
	"go.yaml.in/yaml/v3"
)

// largestShown is how many of the largest tensors inspect lists.
const largestShown = 8

type inspectReport struct {
	Name                string          `json:"name"`
	Kind                string          `json:"kind"`
	Model               *graphio.Model  `json:"model,omitempty"`
	Nodes               int             `json:"nodes,omitempty"`
	Parameters          int64           `json:"parameters"`
	TrainableParameters int64           `json:"trainable_parameters"`
	Ops                 []opCount       `json:"ops,omitempty"`
	Blocks              []blockSummary  `json:"blocks,omitempty"`
	Largest             []tensorSummary `json:"largest_tensors,omitempty"`
	Chain               *graphio.Chain  `json:"chain,omitempty"`
}

type opCount struct {
	Op    string `json:"op"`
	Count int    `json:"count"`
}

type blockSummary struct {
	Name       string `json:"name"`
	Nodes      int    `json:"nodes"`
	Parameters int64  `json:"parameters"`
}

type tensorSummary struct {
	Name  string   `json:"name"`
	Op    string   `json:"op"`
	Shape ir.Shape `json:"shape"`
	DType string   `json:"dtype"`
	Bytes int64    `json:"bytes"`
}

func runInspect(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("inspect", "MODEL", stderr)
	setup := addSetupFlags(fs)
	format := addFormat(fs, "text", "json")
	src, _, err := setup.parse(fs, args)
	if err != nil {
		return err
	}
	r := inspectReport{Name: src.Name, Kind: src.Kind.String(), Model: src.Model, Chain: src.Chain}
	if src.Kind != graphio.KindChain {
		g, err := buildGraph(src)
		if err != nil {
			return graphio.InFile(src.Name, err)
		}
		summarize(&r, g)
	}
	if format.value == "json" {
		return writeJSON(stdout, r)
	}
	return writeInspectText(stdout, &r)
}

func summarize(r *inspectReport, g *ir.Graph) {
	r.Nodes = len(g.Nodes)
	ops := map[ir.Op]int{}
	blocks := map[string]*blockSummary{}
	for i := range g.Nodes {
		n := &g.Nodes[i]
		r.Parameters += g.Params(i)
		r.TrainableParameters += g.TrainableParams(i)
		if n.Op == ir.Input {
			continue
		}
		ops[n.Op]++
		b := blocks[n.Block]
		if b == nil {
			b = &blockSummary{Name: n.Block}
			blocks[n.Block] = b
		}
		b.Nodes++
		b.Parameters += g.Params(i)
	}
	for op, c := range ops {
		r.Ops = append(r.Ops, opCount{op.String(), c})
	}
	sort.Slice(r.Ops, func(i, j int) bool {
		if r.Ops[i].Count != r.Ops[j].Count {
			return r.Ops[i].Count > r.Ops[j].Count
		}
		return r.Ops[i].Op < r.Ops[j].Op
	})
	for _, name := range g.Blocks() {
		r.Blocks = append(r.Blocks, *blocks[name])
	}
	r.Largest = largestTensors(g, largestShown)
}

// largestTensors returns the n largest non-view outputs, largest first,
// ties by graph order.
func largestTensors(g *ir.Graph, n int) []tensorSummary {
	var ids []int
	for i := range g.Nodes {
		if !g.Nodes[i].Op.IsView() {
			ids = append(ids, i)
		}
	}
	sort.SliceStable(ids, func(a, b int) bool { return g.Nodes[ids[a]].Bytes() > g.Nodes[ids[b]].Bytes() })
	var out []tensorSummary
	for _, id := range ids[:min(n, len(ids))] {
		nd := &g.Nodes[id]
		out = append(out, tensorSummary{nd.Name, nd.Op.String(), nd.Shape, nd.DType.String(), nd.Bytes()})
	}
	return out
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// writeFormatted writes v as JSON or YAML, or with text for any other
// format.
func writeFormatted(w io.Writer, format string, v any, text func(io.Writer) error) error {
	switch format {
	case "json":
		return writeJSON(w, v)
	case "yaml":
		enc := yaml.NewEncoder(w)
		enc.SetIndent(2)
		return enc.Encode(v)
	}
	return text(w)
}

func writeInspectText(w io.Writer, r *inspectReport) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	fmt.Fprintf(tw, "%s\t%s\n", r.Kind, r.Name)
	if m := r.Model; m != nil {
		t := &m.Training
		fmt.Fprintf(tw, "family\t%s: %d layers, hidden %d, %d heads (%d kv), ffn %d, vocab %d\n",
			m.Family, m.Layers, m.Hidden, m.Heads, m.KVHeads, m.FFN, m.Vocab)
		if m.Experts > 0 {
			fmt.Fprintf(tw, "experts\t%d of ffn %d, %d per token", m.Experts, m.ExpertFFN, m.ExpertsPerToken)
			if m.SharedExpertFFN > 0 {
				fmt.Fprintf(tw, ", a shared expert of ffn %d", m.SharedExpertFFN)
			}
			if n := len(m.DenseLayers); n > 0 {
				fmt.Fprintf(tw, "; %d dense layers", n)
			}
			fmt.Fprintln(tw)
		}
		fmt.Fprintf(tw, "training\tbatch %d, seq %d, %s, dropout %g, %s attention, profile %s\n",
			t.Batch, t.Seq, t.DType, t.Dropout, t.Attention, t.Profile)
	}
	if c := r.Chain; c != nil {
		fmt.Fprintf(tw, "stages\t%d (costs in %s)\n", len(c.Stages), c.Unit)
		fmt.Fprintf(tw, "input\t%v\n\n", c.InputBytes)
		fmt.Fprintf(tw, "stage\tforward\tbackward\toutput\tsaved\tforward temp\tbackward temp\n")
		for _, s := range c.Stages {
			fmt.Fprintf(tw, "%s\t%g\t%g\t%v\t%v\t%v\t%v\n", s.Name, s.Forward, s.Backward, s.OutputBytes, s.SavedBytes, s.ForwardTempBytes, s.BackwardTempBytes)
		}
		fmt.Fprintf(tw, "loss\t\t%g\t\t\t\t%v\n", c.Loss.Backward, c.Loss.TempBytes)
		return tw.Flush()
	}
	fmt.Fprintf(tw, "nodes\t%d in %d blocks\n", r.Nodes, len(r.Blocks))
	fmt.Fprintf(tw, "parameters\t%s (%s)\n", commas(r.Parameters), human(r.Parameters))
	if r.TrainableParameters != r.Parameters {
		fmt.Fprintf(tw, "trainable\t%s (%s)\n", commas(r.TrainableParameters), human(r.TrainableParameters))
	}
	var ops []string
	for _, o := range r.Ops {
		ops = append(ops, fmt.Sprintf("%s %d", o.Op, o.Count))
	}
	fmt.Fprintf(tw, "ops\t%s\n\n", strings.Join(ops, ", "))
	fmt.Fprintf(tw, "block\tnodes\tparameters\n")
	for _, b := range r.Blocks {
		fmt.Fprintf(tw, "%s\t%d\t%s\n", b.Name, b.Nodes, commas(b.Parameters))
	}
	fmt.Fprintf(tw, "\nlargest tensors\tshape\tdtype\tbytes\n")
	for _, t := range r.Largest {
		fmt.Fprintf(tw, "%s\t%v\t%s\t%v\n", t.Name, t.Shape, t.DType, mem.Bytes(t.Bytes))
	}
	return tw.Flush()
}

// commas formats n with thousands separators.
func commas(n int64) string {
	s := fmt.Sprint(n)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// human formats a count with a metric suffix: 8.03B, 124.4M.
func human(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.2fB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%.1fM", float64(n)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%.1fK", float64(n)/1e3)
	}
	return fmt.Sprint(n)
}
