package export

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/planner"
)

// TestDeepSpeed writes every way of checkpointing tiny-llama's four layers
// (stages 1–4), each from its input, and a few more: DeepSpeed runs each
// pattern as planned (the model's forward checkpoints the layers the
// notes name), number_checkpoints counting the checkpoints a step makes;
// groups of layers kept from their first layer's input are groups of N;
// a layer kept in part is refused without the model to find the closest
// setting.
func TestDeepSpeed(t *testing.T) {
	p := tinyLlama(t)
	for mask := 0; mask < 16; mask++ {
		d := make([]int, 6)
		var names []string
		named := "" // the layers, runs joined: "layers.0–1, layers.3"
		for k := 0; k < 4; k++ {
			if mask&(1<<k) == 0 {
				continue
			}
			d[k+1] = ck
			names = append(names, fmt.Sprintf("layers.%d", k))
			switch {
			case k > 0 && mask&(1<<(k-1)) != 0 && k < 3 && mask&(1<<(k+1)) != 0:
			case k > 0 && mask&(1<<(k-1)) != 0:
				named += fmt.Sprintf("–%d", k)
			case named != "":
				named += fmt.Sprintf(", layers.%d", k)
			default:
				named = fmt.Sprintf("layers.%d", k)
			}
		}
		cfg, notes := deepSpeedOf(t, exportOf(t, p, d))
		want := any(nil)
		if len(names) > 0 {
			want = float64(len(names))
		}
		if got := cfg["activation_checkpointing"].(map[string]any)["number_checkpoints"]; got != want {
			t.Errorf("%v: number_checkpoints %v, want %v", names, got, want)
		}
		if n := len(names); n > 0 && n < 4 && !strings.Contains(notes, fmt.Sprintf("checkpoint %s (%d of 4 decoder layers)", named, n)) {
			t.Errorf("%v: the notes do not name %s:\n%s", names, named, notes)
		}
		switch len(names) {
		case 0:
			if !strings.Contains(notes, "checkpoint no layer") {
				t.Errorf("none: %s", notes)
			}
		case 4:
			if !strings.Contains(notes, "gradient_checkpointing_enable()") {
				t.Errorf("every layer: %s", notes)
			}
		}
	}
	// Groups of two, each from its first layer's input.
	cfg, notes := deepSpeedOf(t, exportOf(t, p, []int{0, ck, n, ck, n, 0}))
	if got := cfg["activation_checkpointing"].(map[string]any)["number_checkpoints"]; got != 2.0 || !strings.Contains(notes, "activation_checkpoint_interval=2") {
		t.Errorf("groups of 2: number_checkpoints %v, notes %s", got, notes)
	}
	// A layer kept in part, or keeping no input outside a group, is not.
	for _, d := range [][]int{{0, option(t, p, "megatron-selective"), 0, 0, 0, 0}, {0, ck, n, 0, 0, 0}} {
		e := exportOf(t, p, d)
		if e.DeepSpeedExact() {
			t.Errorf("%v: DeepSpeed runs it", d)
		}
		if _, err := e.DeepSpeed(new(bytes.Buffer), nil, -1); err == nil || !strings.Contains(err.Error(), "cannot be run by DeepSpeed") {
			t.Errorf("%v: %v", d, err)
		}
	}
}

// deepSpeedOf writes e's DeepSpeed config and returns it parsed, with the
// notes joined.
func deepSpeedOf(t *testing.T, e *Export) (map[string]any, string) {
	t.Helper()
	var b bytes.Buffer
	notes, err := e.DeepSpeed(&b, nil, -1)
	if err != nil {
		t.Fatal(err)
	}
	var cfg map[string]any
	if err := json.Unmarshal(b.Bytes(), &cfg); err != nil {
		t.Fatalf("%v:\n%s", err, b.String())
	}
	ac := cfg["activation_checkpointing"].(map[string]any)
	for _, k := range []string{"partition_activations", "cpu_checkpointing", "contiguous_memory_optimization"} {
		if ac[k] != false {
			t.Errorf("%s = %v: the plan keeps every checkpoint whole on the GPU", k, ac[k])
		}
	}
	return cfg, strings.Join(notes, "\n")
}

// TestDeepSpeedClosest: the closest setting is the cheapest that fits of
// no layer checkpointed and the first k, each replayed as DeepSpeed runs
// it, at every budget between checkpointing every layer and storing all;
// Megatron-LM's none and block k are the same layers.
func TestDeepSpeedClosest(t *testing.T) {
	p := tinyLlama(t)
	first := [][]int{{}, {1}, {1, 2}, {1, 2, 3}, {1, 2, 3, 4}} // chain stages 1 … k
	checkClosest(t, p, DeepSpeedSettings(4), first)
	checkClosest(t, p, MegatronSettings(4), first)
}

// TestDeepSpeedZeRO: under every ZeRO stage the export sets DeepSpeed's
// buckets from the largest layer, counted here from tiny-llama's shapes
// (the four attention projections, the gated MLP's three, two norms),
// instead of DeepSpeed's defaults: under stage 3 the gathering and the
// gradient bucket, under stages 1 and 2 the gradient bucket, one at a
// time. A plan read back from JSON, which does not record the layers'
// sizes, is refused. What DeepSpeed holds under these settings is
// measured in python/tests/test_deepspeed_zero3.py and
// test_deepspeed_zero12.py.
func TestDeepSpeedZeRO(t *testing.T) {
	src, err := graphio.Load("tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	m := src.Model
	hd := m.Hidden / m.Heads
	layer := 2*m.Hidden*m.Hidden + 2*m.Hidden*m.KVHeads*hd + 3*m.Hidden*m.FFN + 2*m.Hidden
	for _, zero := range []int64{1, 2, 3} {
		src, err := graphio.Load("tiny-llama")
		if err != nil {
			t.Fatal(err)
		}
		src.Model.Training.Parallel.DP, src.Model.Training.Parallel.Zero = 2, zero
		p, err := planner.New(src)
		if err != nil {
			t.Fatal(err)
		}
		plan, err := p.PlanSchedule("hand", 0, grouped([]int{0, ck, ck, ck, ck, 0}))
		if err != nil {
			t.Fatal(err)
		}
		e, err := FromPlan(plan)
		if err != nil {
			t.Fatal(err)
		}
		cfg, notes := deepSpeedOf(t, e)
		z := cfg["zero_optimization"].(map[string]any)
		want := map[string]any{"stage": float64(zero), "reduce_bucket_size": float64(layer)}
		if zero < 3 {
			want["contiguous_gradients"], want["overlap_comm"] = true, false
			if !strings.Contains(notes, fmt.Sprintf("largest layer's %d gradients", layer)) {
				t.Errorf("zero %d: the notes do not say the bucket:\n%s", zero, notes)
			}
		}
		if zero == 3 {
			for _, k := range []string{"stage3_prefetch_bucket_size", "stage3_max_live_parameters"} {
				want[k] = float64(layer)
			}
			want["stage3_max_reuse_distance"], want["stage3_param_persistence_threshold"] = 0.0, 0.0
			if !strings.Contains(notes, fmt.Sprintf("largest layer's %d parameters", layer)) {
				t.Errorf("zero 3: the notes do not say the bucket:\n%s", notes)
			}
		}
		if diff := cmp.Diff(want, z); diff != "" {
			t.Errorf("zero %d: zero_optimization (-want +got):\n%s", zero, diff)
		}

		var saved bytes.Buffer
		if err := json.NewEncoder(&saved).Encode(plan); err != nil {
			t.Fatal(err)
		}
		back, err := planner.ReadPlan(&saved)
		if err != nil {
			t.Fatal(err)
		}
		e, err = FromPlan(back)
		if err != nil {
			t.Fatal(err)
		}
		_, err = e.DeepSpeed(new(bytes.Buffer), nil, -1)
		if err == nil || !strings.Contains(err.Error(), "export from the model") {
			t.Errorf("zero %d, a saved plan: %v, want an error saying to export from the model", zero, err)
		}
	}
}
