package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/ckptplan/ckptplan/mem"
)

// costReport is the JSON of 'ckptplan cost'.
type costReport struct {
	Model   string     `json:"model"`
	Profile ir.Profile `json:"profile"`
	// Transformers is the release the transformers profile plans for.
	Transformers string             `json:"transformers,omitempty"`
	Batch        int64              `json:"batch"`
	Seq          int64              `json:"seq"`
	DType        string             `json:"dtype"`
	Autocast     string             `json:"autocast,omitempty"`
	Attention    ir.AttentionKernel `json:"attention"`
	Parallel     ir.Parallel        `json:"parallel"`
	LoRARank     int64              `json:"lora_rank"`
	Static       staticReport       `json:"static"`
	Blocks       []blockReport      `json:"blocks"`
	Totals       totalsReport       `json:"totals"`

	setup  *ir.Setup        // for the text's static line
	static costmodel.Static // likewise
}

// staticReport is the cost report's static memory. Its JSON gives the
// bytes of each static memory term (costmodel.Terms) that holds any, in
// the terms' order, between the optimizer's bytes and the layer's
// gathered bytes.
type staticReport struct {
	Parameters          int64            `json:"parameters"`
	TrainableParameters int64            `json:"trainable_parameters"`
	WeightsBytes        int64            `json:"weights_bytes"`
	GradientsBytes      int64            `json:"gradients_bytes"`
	OptimizerBytes      int64            `json:"optimizer_bytes"`
	Terms               []costmodel.Held `json:"-"`
	// LayerGatheredBytes is the most a decoder layer gathers beside
	// what costmodel.Gathered holds while it runs, forward or backward
	// (ZeRO 3).
	LayerGatheredBytes int64 `json:"layer_gathered_bytes,omitempty"`
	// ReduceBucketBytes and GradientPartitionBytes are DeepSpeed's ZeRO
	// 1 and 2's bucket and the most its gradient partition holds
	// (costmodel.DeepSpeedBuckets).
	ReduceBucketBytes      int64 `json:"reduce_bucket_bytes,omitempty"`
	GradientPartitionBytes int64 `json:"gradient_partition_bytes,omitempty"`
	Paged                  bool  `json:"paged,omitempty"`
	// PagedBytes are the optimizer bytes in CUDA unified memory
	// (costmodel.Static.PagedBytes).
	PagedBytes int64 `json:"paged_bytes,omitempty"`
	TotalBytes int64 `json:"total_bytes"`
	// CallArgsBytes are the positions and masks the model hands every
	// layer's call (costmodel.Static.CallArgs), not in TotalBytes.
	CallArgsBytes int64 `json:"call_args_bytes,omitempty"`
}

// MarshalJSON writes r's fields in their order, each term's bytes after
// the optimizer's.
func (r staticReport) MarshalJSON() ([]byte, error) {
	type field struct {
		key   string
		value any
	}
	fields := []field{{"parameters", r.Parameters}, {"trainable_parameters", r.TrainableParameters},
		{"weights_bytes", r.WeightsBytes}, {"gradients_bytes", r.GradientsBytes}, {"optimizer_bytes", r.OptimizerBytes}}
	for _, h := range r.Terms {
		fields = append(fields, field{h.Term + "_bytes", h.Bytes})
	}
	if r.LayerGatheredBytes != 0 {
		fields = append(fields, field{"layer_gathered_bytes", r.LayerGatheredBytes})
	}
	if r.ReduceBucketBytes != 0 {
		fields = append(fields, field{"reduce_bucket_bytes", r.ReduceBucketBytes}, field{"gradient_partition_bytes", r.GradientPartitionBytes})
	}
	if r.Paged {
		fields = append(fields, field{"paged", true}, field{"paged_bytes", r.PagedBytes})
	}
	fields = append(fields, field{"total_bytes", r.TotalBytes})
	if r.CallArgsBytes != 0 {
		fields = append(fields, field{"call_args_bytes", r.CallArgsBytes})
	}
	var b bytes.Buffer
	b.WriteByte('{')
	for i, f := range fields {
		if i > 0 {
			b.WriteByte(',')
		}
		k, _ := json.Marshal(f.key)
		v, err := json.Marshal(f.value)
		if err != nil {
			return nil, err
		}
		b.Write(k)
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

type blockReport struct {
	Name          string     `json:"name"`
	InputBytes    int64      `json:"input_bytes"`
	SavedBytes    int64      `json:"saved_bytes"`
	HostBytes     int64      `json:"host_bytes,omitempty"` // kept in host memory, apart from saved_bytes
	ForwardFLOPs  int64      `json:"forward_flops"`
	BackwardFLOPs int64      `json:"backward_flops"`
	Ops           []opReport `json:"ops"`
}

type opReport struct {
	Name          string `json:"name"`
	Op            string `json:"op"`
	OutputBytes   int64  `json:"output_bytes"`
	SavedBytes    int64  `json:"saved_bytes"`
	ForwardFLOPs  int64  `json:"forward_flops"`
	BackwardFLOPs int64  `json:"backward_flops"`
}

type totalsReport struct {
	SavedBytes                     int64 `json:"saved_bytes"`
	SavedBytesCheckpointEveryLayer int64 `json:"saved_bytes_checkpoint_every_layer"`
	ForwardFLOPs                   int64 `json:"forward_flops"`
	BackwardFLOPs                  int64 `json:"backward_flops"`
}

func runCost(stdout, stderr io.Writer, args []string) error {
	fs := newFlags("cost", "MODEL", stderr)
	setup := addSetupFlags(fs)
	setup.addTrainingFlags(fs)
	format := addFormat(fs, "text", "json")
	src, arg, err := setup.parse(fs, args)
	if err != nil {
		return err
	}
	if src.Kind == graphio.KindChain {
		return fmt.Errorf("%s is a profiled chain: its costs are given, there is nothing to compute", arg)
	}
	if err := setup.applyTrainingTo(fs, src, arg); err != nil {
		return err
	}
	g, err := buildGraph(src)
	if err != nil {
		return graphio.InFile(src.Name, err)
	}
	c, err := costmodel.Analyze(g)
	if err != nil {
		return graphio.InFile(src.Name, err)
	}
	r := newCostReport(src.Name, c)
	if format.value == "json" {
		return writeJSON(stdout, r)
	}
	return writeCostText(stdout, r)
}

func newCostReport(name string, c *costmodel.Costs) *costReport {
	g, s := c.Graph, c.Graph.Setup
	r := &costReport{
		Model: name, Profile: c.Profile, Transformers: s.Transformers, Batch: s.Batch, Seq: s.Seq, DType: g.DType.String(), Autocast: s.Autocast,
		Attention: s.Attention, Parallel: s.Parallel, LoRARank: s.LoRA.Rank,
		Static: staticReport{
			Parameters: c.Static.Parameters, TrainableParameters: c.Static.TrainableParameters,
			WeightsBytes: c.Static.WeightsBytes, GradientsBytes: c.Static.GradientsBytes,
			OptimizerBytes: c.Static.OptimizerBytes, TotalBytes: c.Static.Total(),
			Terms: c.Static.Terms, LayerGatheredBytes: c.Static.Gather.LayerBytes(), Paged: c.Static.Paged, PagedBytes: c.Static.PagedBytes,
			CallArgsBytes: c.Static.CallArgs,
		},
		Totals: totalsReport{c.SavedBytes, c.SavedBytesCheckpointEveryLayer, c.ForwardFLOPs, c.BackwardFLOPs},
		setup:  &g.Setup, static: c.Static,
	}
	if b := c.Static.Buckets; b != nil {
		r.Static.ReduceBucketBytes, r.Static.GradientPartitionBytes = b.Bucket, b.Partition
	}
	for _, b := range c.Blocks {
		br := blockReport{Name: b.Name, InputBytes: b.InputBytes, SavedBytes: b.SavedBytes, HostBytes: b.HostBytes, ForwardFLOPs: b.ForwardFLOPs, BackwardFLOPs: b.BackwardFLOPs, Ops: []opReport{}}
		for _, id := range b.Nodes {
			n, nc := &g.Nodes[id], &c.Nodes[id]
			br.Ops = append(br.Ops, opReport{n.Name, n.Op.String(), nc.OutputBytes, nc.SavedBytes, nc.ForwardFLOPs, nc.BackwardFLOPs})
		}
		r.Blocks = append(r.Blocks, br)
	}
	return r
}

// layersShown is how many layers the text table lists before eliding the
// identical middle ones.
const layersShown = 4

func writeCostText(w io.Writer, r *costReport) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(w, "model %s: profile %s, batch %d, seq %d, %s, %s attention", r.Model, profileName(r.Profile, r.Transformers), r.Batch, r.Seq, precision(r.DType, r.Autocast), r.Attention)
	if p := r.Parallel; p.TP > 1 || p.DP > 1 {
		fmt.Fprintf(w, ", tp %d, sp %v, dp %d, zero %d", p.TP, p.SP, p.DP, p.Zero)
		if sh := p.Sharder(); sh != "" {
			fmt.Fprintf(w, " (%s)", sh)
		}
	}
	if r.LoRARank > 0 {
		fmt.Fprintf(w, ", LoRA rank %d", r.LoRARank)
	}
	fmt.Fprintf(w, "\n\n")
	fmt.Fprintf(tw, "block\tinput\tkept for backward\tforward FLOPs\tbackward FLOPs\t\n")
	layers, total := 0, countLayers(r)
	for _, b := range r.Blocks {
		if strings.HasPrefix(b.Name, "layers.") {
			layers++
			// Layers are alike: show the first few and the last.
			if layers > layersShown && layers < total {
				if layers == layersShown+1 {
					fmt.Fprintf(tw, "…\t\t\t\t\t\n")
				}
				continue
			}
		}
		fmt.Fprintf(tw, "%s\t%v\t%v\t%s\t%s\t\n", b.Name, mem.Bytes(b.InputBytes), mem.Bytes(b.SavedBytes), flops(b.ForwardFLOPs), flops(b.BackwardFLOPs))
	}
	t := r.Totals
	fmt.Fprintf(tw, "total\t\t%v\t%s\t%s\t\n", mem.Bytes(t.SavedBytes), flops(t.ForwardFLOPs), flops(t.BackwardFLOPs))
	if err := tw.Flush(); err != nil {
		return err
	}
	s := r.Static
	fmt.Fprintf(w, "\nactivations kept: %v; with every layer checkpointed: %v\n", mem.Bytes(t.SavedBytes), mem.Bytes(t.SavedBytesCheckpointEveryLayer))
	fmt.Fprintf(w, "static memory: %v (%s); %s parameters, %s trainable\n", mem.Bytes(s.TotalBytes), staticParts(r.setup, &r.static), human(s.Parameters), human(s.TrainableParameters))
	if d := r.static.Gather.DeepSpeed; d != nil {
		fmt.Fprintf(w, "DeepSpeed's ZeRO 3 gathers module by module, with the buckets 'export --to deepspeed' sets: at most %v gathered at once, %v with the gradients a backward holds beside the bucket\n", mem.Bytes(d.Most()), mem.Bytes(d.MostReduced()))
	}
	if b := r.static.Buckets; b != nil {
		from := "the backward's end"
		if b.Stage >= 2 {
			from = "its first reduction"
		}
		fmt.Fprintf(w, "DeepSpeed's ZeRO %d reduces the gradients through a bucket of %v, from the loss's backward to the backward's end, into a gradient partition of up to %v (each parameter with an element in the rank's share, whole), from %s to the step, each reduction through a flattened copy of what it reduces\n",
			b.Stage, mem.Bytes(b.Bucket), mem.Bytes(b.Partition), from)
	}
	if s.CallArgsBytes > 0 {
		fmt.Fprintf(w, "every layer's call takes the forward's positions and masks, %v: held to the forward's end, or by a checkpointed or selective layer's call to its backward\n", mem.Bytes(s.CallArgsBytes))
	}
	return nil
}

func countLayers(r *costReport) int {
	n := 0
	for _, b := range r.Blocks {
		if strings.HasPrefix(b.Name, "layers.") {
			n++
		}
	}
	return n
}

// flops formats a FLOP count with a metric prefix: "1.23 TFLOP".
func flops(f int64) string {
	v := float64(f)
	for _, u := range []struct {
		div  float64
		name string
	}{{1e15, "PFLOP"}, {1e12, "TFLOP"}, {1e9, "GFLOP"}, {1e6, "MFLOP"}, {1e3, "kFLOP"}} {
		if v >= u.div {
			return fmt.Sprintf("%.2f %s", v/u.div, u.name)
		}
	}
	return fmt.Sprintf("%d FLOP", f)
}

// precision names the dtype a step trains in: "bf16", or "fp32 weights
// under bf16 autocast".
func precision(dtype, autocast string) string {
	if autocast == "" {
		return dtype
	}
	return dtype + " weights under " + autocast + " autocast"
}

// profileName names the profile a step is planned with: "transformers
// 5.24" for the transformers profile of one release.
func profileName(profile ir.Profile, release string) string {
	if profile == ir.ProfileTransformers && release != "" {
		return "transformers " + release
	}
	return profile.String()
}
