package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/models"
	"github.com/google/go-cmp/cmp"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/NAME, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if diff := cmp.Diff(string(want), got); diff != "" {
		t.Errorf("%s (-want +got)\n%s", path, diff)
	}
}

func runCmd(args ...string) (stdout, stderr string, err error) {
	var o, e bytes.Buffer
	err = run(&o, &e, args)
	return o.String(), e.String(), err
}

func TestInspectGolden(t *testing.T) {
	for _, name := range models.Names() {
		for _, format := range []string{"text", "json"} {
			t.Run(name+"/"+format, func(t *testing.T) {
				out, _, err := runCmd("inspect", name, "--format", format)
				if err != nil {
					t.Fatal(err)
				}
				golden(t, "inspect/"+name+"."+format+".stdout", out)
			})
		}
	}
}

func TestCostGolden(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"tiny-llama", []string{"cost", "tiny-llama"}},
		{"tiny-gpt2-json", []string{"cost", "tiny-gpt2", "--format", "json"}},
		{"llama-3-8b", []string{"cost", "llama-3-8b", "--seq", "8192"}},
		{"gpt3-175b-tp8-sp", []string{"cost", "gpt3-175b", "--tp", "8", "--sp"}},
		{"llama-2-13b-lora-flash", []string{"cost", "llama-2-13b", "--lora-rank", "64", "--attention", "flash", "--batch", "2", "--seq", "8192"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runCmd(tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "cost/"+tt.name+".stdout", out)
		})
	}
}

func TestPlanGolden(t *testing.T) {
	tests := []struct {
		name string
		args []string
	}{
		{"tiny-llama", []string{"plan", "tiny-llama", "--budget", "5MiB"}},
		{"tiny-gpt2-json", []string{"plan", "tiny-gpt2", "--budget", "4MiB", "--format", "json"}},
		{"tiny-gpt2-every-k-yaml", []string{"plan", "tiny-gpt2", "--budget", "8MiB", "--solver", "every-k", "--format", "yaml"}},
		{"llama-3-8b-device-reserve", []string{"plan", "llama-3-8b", "--device", "rtx-4090", "--reserve", "3GiB", "--lora-rank", "16", "--seq", "2048", "--solver", "optimal"}},
		{"llama-3-8b-time", []string{"plan", "llama-3-8b", "--device", "h100-80gb", "--lora-rank", "16", "--seq", "8192", "--batch", "2", "--objective", "time"}},
		// ZeRO 3's gathers over PCIe outlast the compute they overlap;
		// over NVLink, ZeRO 1's reductions hide behind the backwards and
		// its gather after the step does not.
		{"llama-3-8b-zero3-pcie-time", []string{"plan", "llama-3-8b", "--device", "h100-pcie", "--dp", "8", "--zero", "3", "--seq", "1024", "--batch", "1", "--objective", "time"}},
		// Paged 8-bit AdamW at a micro-batch whose plan fits only with
		// part of the optimizer's state on the host, and its export.
		{"llama-3-8b-paged-h100", []string{"plan", "llama-3-8b", "--device", "h100-80gb", "--dtype", "bf16", "--batch", "4", "--optimizer", "paged-adamw8bit"}},
		{"llama-3-8b-paged-h100-hf", []string{"export", "llama-3-8b", "--device", "h100-80gb", "--dtype", "bf16", "--batch", "4", "--optimizer", "paged-adamw8bit", "--to", "hf"}},
		{"llama-3-8b-zero3-last-gathered", []string{"plan", "llama-3-8b", "--device", "h100-80gb", "--dp", "8", "--zero", "3", "--reshard", "all-but-last", "--transformers", "4.46", "--seq", "4096", "--solver", "none"}},
		{"llama-3-8b-zero1-time", []string{"plan", "llama-3-8b", "--device", "h100-80gb", "--dp", "8", "--zero", "1", "--seq", "4096", "--batch", "2", "--grad-accum", "2", "--objective", "time"}},
		{"tiny-llama-roofline", []string{"plan", "tiny-llama", "--budget", "5MiB", "--roofline", "matrix=50e9,bandwidth=10e9,launch=10e-6,sync"}},
		// QLoRA on a 24 GB GPU: NF4 weights with double quantization,
		// fp32 adapters on every linear, paged 8-bit AdamW.
		{"llama-3-8b-qlora-4090", []string{"plan", "llama-3-8b", "--device", "rtx-4090", "--seq", "4096", "--lora-rank", "16", "--lora-targets", "q,k,v,o,gate,up,down", "--lora-dtype", "fp32",
			"--quant", "nf4", "--double-quant", "--optimizer", "paged-adamw8bit"}},
		{"llama-3-8b-qlora-cost-json", []string{"cost", "llama-3-8b", "--seq", "4096", "--lora-rank", "16", "--lora-targets", "q,k,v,o,gate,up,down", "--lora-dtype", "fp32",
			"--quant", "nf4", "--double-quant", "--optimizer", "paged-adamw8bit", "--format", "json"}},
		{"chain", []string{"plan", "../../graphio/testdata/chains/mlp4.yaml", "--budget", "64MiB"}},
		// A model folder as PEFT saves one: config.json and the adapter's
		// adapter_config.json (rank 16 on q_proj, k_proj, v_proj, o_proj).
		{"peft-folder", []string{"plan", "../../graphio/testdata/peft/llama-3.2-1b-lora", "--budget", "16GiB", "--seq", "4096"}},
		{"compare-llama-3-8b", []string{"compare", "llama-3-8b", "--seq", "8192", "--budget", "40GiB"}},
		{"compare-llama-3-8b-200", []string{"compare", "llama-3-8b", "--seq", "8192", "--budget", "200GiB"}},
		{"compare-tiny-llama-device", []string{"compare", "tiny-llama", "--device", "l4"}},
		{"compare-tiny-llama-json", []string{"compare", "tiny-llama", "--budget", "5MiB", "--format", "json"}},
		{"export-hf-selective", []string{"export", "../../graphio/testdata/hf/llama-3-8b.json", "--lora-rank", "16", "--seq", "8192", "--budget", "50GiB", "--to", "hf"}},
		{"export-hf", []string{"export", "tiny-llama", "--budget", "5MiB", "--solver", "optimal", "--to", "hf"}},
		{"export-megatron", []string{"export", "llama-3-70b", "--tp", "8", "--sp", "--seq", "4096", "--zero", "1", "--dp", "64", "--device", "h100-80gb", "--profile", "megatron", "--attention", "eager", "--solver", "megatron-selective", "--to", "megatron"}},
		{"gpt3-175b-pp8", []string{"plan", "gpt3-175b", "--tp", "8", "--sp", "--pp", "8", "--microbatches", "64", "--device", "h100-80gb"}},
		{"gpt3-175b-pp8-interleaved", []string{"plan", "gpt3-175b", "--tp", "8", "--sp", "--pp", "8", "--microbatches", "64", "--pp-schedule", "interleaved", "--virtual-stages", "2", "--device", "h100-80gb", "--solver", "megatron-selective"}},
		// A pipeline's own plan where Megatron can write it, else the
		// cheapest setting it can that fits every stage.
		{"export-megatron-pp8", []string{"export", "gpt3-175b", "--tp", "8", "--sp", "--pp", "8", "--microbatches", "64", "--device", "h100-80gb", "--solver", "megatron-selective", "--to", "megatron"}},
		{"export-megatron-pp8-closest", []string{"export", "gpt3-175b", "--tp", "8", "--sp", "--pp", "8", "--microbatches", "64", "--budget", "55GiB", "--to", "megatron"}},
		{"export-megatron-pp4-interleaved", []string{"export", "llama-3-70b", "--tp", "8", "--sp", "--profile", "megatron", "--attention", "eager", "--pp", "4", "--microbatches", "8", "--pp-schedule", "interleaved", "--virtual-stages", "2", "--device", "h100-80gb", "--to", "megatron"}},
		// torchtitan's setting when it is the plan's, else the cheapest
		// that fits.
		{"export-torchtitan", []string{"export", "llama-3-8b", "--device", "h100-80gb", "--seq", "8192", "--dp", "8", "--zero", "3", "--solver", "every-k", "--to", "torchtitan"}},
		{"export-torchtitan-closest", []string{"export", "llama-3-8b", "--device", "h100-80gb", "--seq", "8192", "--dp", "8", "--zero", "3", "--to", "torchtitan"}},
		{"llama-3-8b-zero1-cost", []string{"cost", "llama-3-8b", "--seq", "8192", "--dp", "8", "--zero", "1"}},
		{"llama-3-8b-zero2-cost", []string{"cost", "llama-3-8b", "--seq", "8192", "--dp", "8", "--zero", "2"}},
		{"llama-3-8b-zero3-deepspeed-cost", []string{"cost", "llama-3-8b", "--seq", "8192", "--dp", "8", "--zero", "3", "--sharding", "deepspeed"}},
		// PyTorch's AdamW over bf16 weights, as a plain training loop runs
		// it: bf16 moments, no master copy.
		{"llama-3-8b-master-none", []string{"plan", "llama-3-8b", "--budget", "80GiB", "--seq", "4096", "--master-weights", "none"}},
		// DeepSpeed's stage 3: its gradient bucket all step, and the
		// gradients converted to fp32 in its step.
		{"llama-3-8b-zero3-deepspeed", []string{"plan", "llama-3-8b", "--device", "h100-80gb", "--seq", "8192", "--dp", "8", "--zero", "3", "--sharding", "deepspeed", "--solver", "every-k"}},
		{"llama-3-8b-zero3-no-sync", []string{"plan", "llama-3-8b", "--device", "h100-80gb", "--seq", "8192", "--dp", "8", "--zero", "3", "--no-sync"}},
		// torchtitan's op-level policy: the plan's, and the closest
		// setting to a selective plan in 150 GiB.
		{"export-torchtitan-op", []string{"export", "llama-3-8b", "--budget", "150GiB", "--solver", "torchtitan-op", "--to", "torchtitan"}},
		{"export-torchtitan-closest-op", []string{"export", "llama-3-8b", "--budget", "150GiB", "--to", "torchtitan"}},
		{"plan-torchtitan-op", []string{"plan", "llama-3-8b", "--budget", "150GiB", "--solver", "torchtitan-op"}},
		{"plan-pp-torchtitan-op", []string{"plan", "llama-3-8b", "--budget", "80GiB", "--pp", "2", "--microbatches", "4", "--solver", "torchtitan-op"}},
		{"export-torchtitan-optimal", []string{"export", "llama-3-8b", "--device", "h100-80gb", "--seq", "8192", "--dp", "8", "--zero", "3", "--solver", "optimal", "--to", "torchtitan"}},
		{"tiny-llama-pp2", []string{"plan", "tiny-llama", "--pp", "2", "--microbatches", "4", "--budget", "3MiB"}},
		{"tiny-llama-pp2-time", []string{"plan", "tiny-llama", "--pp", "2", "--microbatches", "4", "--budget", "3MiB", "--roofline", "matrix=1e12,bandwidth=1e11,link=1e9"}},
		{"tiny-llama-pp2-dp2-time", []string{"plan", "tiny-llama", "--pp", "2", "--microbatches", "4", "--budget", "3.5MiB", "--roofline", "matrix=1e12,bandwidth=1e11,link=1e9", "--dp", "2", "--zero", "1"}},
		{"export-pytorch", []string{"export", "tiny-gpt2", "--budget", "2.9MiB", "--to", "pytorch"}},
		// Groups of k layers are Megatron's uniform method.
		// Megatron-LM's closest setting on one stage: selective, or block N.
		{"export-megatron-closest", []string{"export", "llama-3-70b", "--tp", "8", "--sp", "--seq", "4096", "--zero", "1", "--dp", "64", "--device", "h100-80gb", "--profile", "megatron", "--attention", "eager", "--to", "megatron"}},
		{"export-megatron-closest-block", []string{"export", "llama-3-8b", "--profile", "megatron", "--attention", "eager", "--seq", "8192", "--zero", "1", "--dp", "8", "--budget", "86GiB", "--to", "megatron"}},
		// Selective recomputation of modules (--recompute-modules): the
		// closest setting, and a plan that is one.
		{"export-megatron-closest-modules", []string{"export", "llama-3-8b", "--profile", "megatron", "--attention", "eager", "--seq", "8192", "--zero", "1", "--dp", "8", "--budget", "90GiB", "--to", "megatron"}},
		{"export-megatron-modules", []string{"export", "gpt3-175b", "--tp", "8", "--sp", "--device", "h100-80gb", "--pp", "8", "--microbatches", "64", "--solver", "megatron-selective", "--recompute-modules", "core_attn,mlp", "--to", "megatron"}},
		{"plan-megatron-modules", []string{"plan", "llama-3-8b", "--profile", "megatron", "--attention", "eager", "--seq", "8192", "--zero", "1", "--dp", "8", "--budget", "90GiB", "--solver", "megatron-selective", "--recompute-modules", "core_attn,layernorm,mlp"}},
		{"export-megatron-every-2", []string{"export", "llama-3-8b", "--profile", "megatron", "--seq", "8192", "--batch", "4", "--budget", "200GiB", "--solver", "every-k", "--k", "2", "--to", "megatron"}},
		{"export-megatron-every-3", []string{"export", "llama-3-8b", "--profile", "megatron", "--seq", "8192", "--batch", "4", "--budget", "200GiB", "--solver", "every-k", "--k", "3", "--to", "megatron"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runCmd(tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "plan/"+tt.name+".stdout", out)
		})
	}
}

func TestFit(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"tiny-llama.stdout", []string{"fit", "tiny-llama", "--budget", "6MiB", "--gpus", "2", "--global-batch", "16", "--seq-multiple", "16"}},
		{"tiny-llama-largest.stdout", []string{"fit", "tiny-llama", "--budget", "4200KiB"}},
		{"llama-3-8b.stdout", []string{"fit", "llama-3-8b", "--device", "h100-80gb", "--seq", "4096", "--global-batch", "64"}},
		{"llama-3-8b-time.stdout", []string{"fit", "llama-3-8b", "--device", "h100-80gb", "--seq", "4096", "--global-batch", "64", "--objective", "time"}},
		{"llama-3-8b-gpus-time.stdout", []string{"fit", "llama-3-8b", "--device", "h100-pcie", "--gpus", "8", "--seq", "4096", "--global-batch", "64", "--objective", "time"}},
		{"tiny-gpt2.json", []string{"fit", "tiny-gpt2", "--budget", "3MiB", "--global-batch", "8", "--format", "json"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			out, _, err := runCmd(tt.args...)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "fit/"+tt.name, out)
		})
	}
}

// TestLeastChangeFits plans what does not fit, and then with the change
// its error names: the plan must fit, for the same sequences a step. A
// pipeline's change may leave the pipeline ("without --pp"): its
// pipeline flags are dropped then.
func TestLeastChangeFits(t *testing.T) {
	for _, args := range [][]string{
		{"plan", "tiny-llama", "--budget", "4200KiB", "--batch", "2"},
		{"plan", "tiny-llama", "--budget", "3MiB"},
		{"plan", "tiny-llama", "--budget", "5MiB", "--batch", "16", "--dp", "2"},
		{"plan", "qwen2-1.5b", "--device", "h100-80gb", "--batch", "8"},
		{"plan", "llama-3-8b", "--device", "h100-80gb", "--seq", "4096"},
		{"plan", "llama-3-70b", "--device", "h100-80gb", "--batch", "1"},
		{"plan", "tiny-llama", "--budget", "2200KiB", "--pp", "2", "--microbatches", "4"},
		{"plan", "llama-3-8b", "--device", "h100-80gb", "--seq", "16384", "--pp", "2", "--microbatches", "4"},
		{"plan", "llama-3-70b", "--device", "h100-80gb", "--tp", "4", "--pp", "2", "--microbatches", "8"},
		{"plan", "llama-3-70b", "--device", "h100-80gb", "--tp", "2", "--dp", "4", "--seq", "4096"},
		{"plan", "llama-3-70b", "--device", "h100-80gb", "--tp", "8", "--pp", "2", "--microbatches", "4", "--seq", "8192"},
		{"plan", "tiny-llama", "--budget", "2600KiB", "--pp", "2", "--microbatches", "8", "--pp-schedule", "interleaved", "--virtual-stages", "2"},
	} {
		t.Run(strings.Join(args, " "), func(t *testing.T) {
			_, _, err := runCmd(args...)
			if err == nil {
				t.Fatal("it fits")
			}
			msg := err.Error()
			i := strings.Index(msg, "; --")
			j := strings.Index(msg, " fits, the same")
			if i < 0 || j < i {
				t.Fatalf("no change named: %s", msg)
			}
			change := strings.Fields(msg[i+2 : j])
			base := slices.Clone(args)
			drop := func(flags ...string) {
				for _, flag := range flags {
					if at := slices.Index(base, flag); at >= 0 {
						base = slices.Delete(base, at, at+2)
					}
				}
			}
			schedule := []string{"--pp-schedule", "--virtual-stages", "--pp-layers"}
			if k := slices.Index(change, "without"); k >= 0 {
				change = change[:k]
				drop(append(schedule, "--pp", "--microbatches")...)
			}
			if k := slices.Index(change, "under"); k >= 0 {
				change = change[:k]
				drop(schedule...)
			}
			gpus := int64(1) // tensor × data × pipeline ranks, as given
			for _, flag := range []string{"--tp", "--dp", "--pp"} {
				if at := slices.Index(args, flag); at >= 0 {
					n, _ := strconv.ParseInt(args[at+1], 10, 64)
					gpus *= n
				}
			}
			out, _, err := runCmd(append(append(base, change...), "--format", "json")...)
			if err != nil {
				t.Fatalf("with %v: %v", change, err)
			}
			var plan struct {
				Feasible bool `json:"feasible"`
				Setup    struct {
					Batch     int64 `json:"batch"`
					GradAccum int64 `json:"grad_accum"`
					Parallel  struct {
						DP int64 `json:"dp"`
						TP int64 `json:"tp"`
					} `json:"parallel"`
				} `json:"setup"`
				Pipeline struct {
					Stages       int64 `json:"stages"`
					Microbatches int64 `json:"microbatches"`
				} `json:"pipeline"`
			}
			if err := json.Unmarshal([]byte(out), &plan); err != nil {
				t.Fatal(err)
			}
			s := plan.Setup
			steps := max(s.GradAccum, 1)
			if m := plan.Pipeline.Microbatches; m > 0 {
				steps = m
			}
			if !plan.Feasible || !strings.Contains(msg, fmt.Sprintf("the same %d sequences", s.Batch*steps*max(s.Parallel.DP, 1))) &&
				!strings.Contains(msg, "the same sequence a step") {
				t.Errorf("with %v: fits %v, setup %+v: %s", change, plan.Feasible, s, msg)
			}
			if got := max(s.Parallel.TP, 1) * max(s.Parallel.DP, 1) * max(plan.Pipeline.Stages, 1); got != gpus {
				t.Errorf("with %v: %d GPUs, want %d: %s", change, got, gpus, msg)
			}
		})
	}
}

// TestRooflineFlag checks --roofline's refusals, which the flag package
// prints with the usage.
func TestRooflineFlag(t *testing.T) {
	for value, want := range map[string]string{
		"matrix=1e9":                                          "roofline: bandwidth must be positive, got 0",
		"matrix=1e9,bandwidth=fast":                           `bandwidth: "fast" is not a number`,
		"matrix=1e9,bandwidth=1e9,color=red":                  `unknown key "color"`,
		"matrix=1e9,bandwidth=1e9,matrix-efficiency=2":        "an efficiency is a share of a peak, at most 1",
		"matrix=1e9,bandwidth=1e9,launch=-1":                  "launch time must be zero or more",
		"matrix=1e9,bandwidth":                                `"bandwidth" is not key=value`,
		"matrix=NaN,bandwidth=1e9":                            "matrix FLOP/s must be positive",
		"matrix=1e9,bandwidth=1e9,host=-1":                    "host link bandwidth must be positive",
		"matrix=1e9,bandwidth=1e9,host=1e9,host-efficiency=2": "host link efficiency is a share of the link",
	} {
		_, stderr, err := runCmd("plan", "tiny-llama", "--budget", "8MiB", "--roofline", value)
		if err == nil || !strings.Contains(stderr, want) {
			t.Errorf("--roofline %s: %v, stderr %q, want %q", value, err, stderr, want)
		}
	}
}

func TestRun(t *testing.T) {
	out, _, err := runCmd("run", "tiny-llama", "--budget", "5MiB")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "run/tiny-llama.stdout", out)
	out, _, err = runCmd("run", "tiny-gpt2", "--budget", "3MiB", "--solver", "revolve", "--attention", "flash", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	var rep struct {
		Predicted      int64 `json:"predicted_peak_bytes"`
		Measured       int64 `json:"measured_peak_bytes"`
		GradientsMatch bool  `json:"gradients_match"`
		Timeline       bool  `json:"timeline_matches"`
	}
	if err := json.Unmarshal([]byte(out), &rep); err != nil {
		t.Fatal(err)
	}
	if rep.Predicted != rep.Measured || !rep.GradientsMatch || !rep.Timeline || rep.Predicted == 0 {
		t.Errorf("run report %+v", rep)
	}
}

func TestSweepAndFigures(t *testing.T) {
	out, _, err := runCmd("sweep", "tiny-llama")
	if err != nil {
		t.Fatal(err)
	}
	golden(t, "sweep/tiny-llama.stdout", out)
	dir := t.TempDir()
	for _, args := range [][]string{
		{"sweep", "tiny-gpt2", "--svg", filepath.Join(dir, "sweep.svg")},
		{"sweep", "tiny-gpt2", "--svg", filepath.Join(dir, "sweep.png")},
		{"plan", "tiny-llama", "--budget", "5MiB", "--timeline", filepath.Join(dir, "plan.svg")},
		{"run", "tiny-llama", "--budget", "5MiB", "--timeline", filepath.Join(dir, "run.png")},
	} {
		if _, _, err := runCmd(args...); err != nil {
			t.Fatalf("%v: %v", args, err)
		}
		if st, err := os.Stat(args[len(args)-1]); err != nil || st.Size() < 1000 {
			t.Errorf("%v: figure %v", args, err)
		}
	}
	// A figure that cannot be written leaves nothing behind.
	bad := filepath.Join(dir, "missing", "x.svg")
	if _, _, err := runCmd("sweep", "tiny-gpt2", "--svg", bad); err == nil {
		t.Error("writing into a missing directory succeeded")
	}
	if _, _, err := runCmd("sweep", "tiny-gpt2", "--svg", filepath.Join(dir, "x.pdf")); err == nil {
		t.Error("a .pdf figure was accepted")
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary file %s left behind", e.Name())
		}
	}
}

// TestCostEveryModel runs cost on every bundled model and on a config.json
// and checks each op's FLOPs by the published conventions: a product
// (linear, an expert's, a matmul) costs twice its forward in the backward,
// the gradients of its input and of its weight (Kaplan et al. 2020,
// §2.1: 2N forward, 4N backward); fused attention 2.5 times
// (FlashAttention-2, Dao 2023, §4.1); every other op is counted as free.
// (A product that reads the data, whose gradient nothing needs, costs its
// forward once: the graph's stem.) The totals are the blocks' sums.
func TestCostEveryModel(t *testing.T) {
	args := append(models.Names(), "../../graphio/testdata/hf/llama-3-8b.json", "../../graphio/testdata/graphs/resmlp.yaml")
	// The backward's FLOPs over the forward's, as a fraction.
	products := map[string][2]int64{"linear": {2, 1}, "expert_linear": {2, 1}, "matmul": {2, 1}, "attention": {5, 2}}
	for _, name := range args {
		out, _, err := runCmd("cost", name, "--format", "json")
		if err != nil {
			t.Errorf("cost %s: %v", name, err)
			continue
		}
		var r costReport
		if err := json.Unmarshal([]byte(out), &r); err != nil {
			t.Fatalf("cost %s: %v", name, err)
		}
		var fwd, bwd int64
		for _, b := range r.Blocks {
			fwd, bwd = fwd+b.ForwardFLOPs, bwd+b.BackwardFLOPs
			for _, o := range b.Ops {
				ratio, product := products[o.Op]
				if name == "../../graphio/testdata/graphs/resmlp.yaml" && o.Name == "stem" {
					ratio = [2]int64{1, 1}
				}
				switch {
				case !product && (o.ForwardFLOPs != 0 || o.BackwardFLOPs != 0):
					t.Errorf("%s: %s (%s) costs %d forward, %d backward; want none", name, o.Name, o.Op, o.ForwardFLOPs, o.BackwardFLOPs)
				case product && (o.ForwardFLOPs <= 0 || ratio[1]*o.BackwardFLOPs != ratio[0]*o.ForwardFLOPs):
					t.Errorf("%s: %s (%s) costs %d forward, %d backward; want %d/%d times", name, o.Name, o.Op, o.ForwardFLOPs, o.BackwardFLOPs, ratio[0], ratio[1])
				}
			}
		}
		if fwd != r.Totals.ForwardFLOPs || bwd != r.Totals.BackwardFLOPs || fwd <= 0 {
			t.Errorf("%s: totals %d forward, %d backward; the blocks' sum %d, %d", name, r.Totals.ForwardFLOPs, r.Totals.BackwardFLOPs, fwd, bwd)
		}
		if r.Static.Parameters <= 0 || r.Static.TotalBytes < r.Static.WeightsBytes {
			t.Errorf("%s: static %+v", name, r.Static)
		}
	}
}

func TestErrors(t *testing.T) {
	tests := []struct {
		args  []string
		usage bool
		want  string
	}{
		{[]string{}, true, ""},
		{[]string{"frobnicate"}, true, `unknown command "frobnicate"`},
		{[]string{"inspect"}, true, "inspect: missing MODEL"},
		{[]string{"inspect", "a", "b"}, true, "want one MODEL"},
		{[]string{"inspect", "--format", "xml", "gpt2"}, true, ""},
		{[]string{"inspect", "no-such-model"}, false, `unknown model "no-such-model"`},
		{[]string{"inspect", "missing.yaml"}, false, "missing.yaml: no such file"},
		{[]string{"inspect", "gpt2", "--dtype", "fp8"}, true, `--dtype: unknown value "fp8"`},
		{[]string{"cost", "gpt2", "--tp", "5"}, false, "tensor parallel degree 5 does not divide 12 heads"},
		{[]string{"inspect", "../../graphio/testdata/bad/model-typo.yaml"}, false, `model-typo.yaml:5:1: unknown key "heds"`},
		{[]string{"plan", "tiny-llama"}, true, "need --budget or --device"},
		{[]string{"plan", "tiny-llama", "--budget", "12 parsecs"}, true, ""},
		{[]string{"plan", "tiny-llama", "--budget", "4096B"}, false, "tiny-llama does not fit in 4 KiB"},
		{[]string{"plan", "tiny-llama", "--budget", "1MiB"}, false, "tiny-llama does not fit in 1 MiB with the selective solver: it needs at least 4.26 MiB"},
		{[]string{"plan", "tiny-llama", "--budget", "4.2MiB"}, false, "tiny-llama does not fit in 4.20 MiB with the selective solver: it needs at least"},
		// What does not fit is named, with what holds less of it: the
		// static memory (the cost report's 4.01 MiB), or the activations
		// beyond it.
		{[]string{"plan", "tiny-llama", "--budget", "3.5MiB"}, false, "static memory 4.01 MiB (weights 1.00 MiB, gradients 1.00 MiB, optimizer 2.00 MiB, step counters 156 B, buffers 4.03 KiB) passes the budget alone, most of it optimizer state (2.00 MiB); --optimizer adamw8bit fits, the same 2 sequences a step"},
		{[]string{"plan", "tiny-llama", "--budget", "4.2MiB", "--batch", "2"}, false, "and at the least peak, in the backward of layers.0: static 3.01 MiB + gradients 705.75 KiB + activations 433.51 KiB + working memory 144 KiB; --optimizer adamw8bit fits, the same 2 sequences a step"},
		// Settings the setup already uses are not offered again.
		{[]string{"plan", "tiny-llama", "--budget", "100KiB", "--lora-rank", "4", "--quant", "nf4"}, false, "passes the budget alone, most of it weights (382 KiB); an 8-bit optimizer (--optimizer adamw8bit) or sharding over GPUs (--zero, --dp) hold less"},
		// AdamW's foreach step holds a moment-sized copy beside the gradients.
		{[]string{"plan", "tiny-llama", "--budget", "4.5MiB", "--optimizer", "adamw"}, false, "tiny-llama does not fit in 4.50 MiB with the selective solver: it needs at least 5.01 MiB"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--solver", "magic"}, true, `unknown strategy "magic"`},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--recompute-modules", "mlp"}, true, "the modules are megatron-selective's: add --solver megatron-selective"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--solver", "megatron-selective", "--recompute-modules", "attn"}, true, `unknown module "attn" (valid: core_attn, layernorm, mlp)`},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--solver", "megatron-selective", "--recompute-modules", "moe_act"}, true, "moe_act is a module of Megatron-LM's that ckptplan does not model"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--solver", "megatron-selective", "--recompute-modules", "mlp,mlp"}, true, "mlp is given twice"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--solver", "megatron-selective", "--recompute-modules", ","}, true, `no module in ","`},
		{[]string{"plan", "tiny-llama", "--attention", "sdpa", "--budget", "5MiB", "--solver", "megatron-selective", "--recompute-modules", "core_attn"}, false, "has no attention core to recompute: megatron-selective needs eager attention"},
		{[]string{"plan", "mixtral-8x7b", "--budget", "500GiB", "--solver", "megatron-selective", "--recompute-modules", "mlp"}, false, "recomputing mlp is Megatron-LM's, which the megatron profile plans: add --profile megatron"},
		{[]string{"plan", "tiny-llama", "--device", "tpu"}, true, `unknown device "tpu"`},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--device", "tpu"}, true, `unknown device "tpu"`},
		{[]string{"cost", "tiny-llama", "--profile", "pytorch"}, true, `--profile: unknown value "pytorch"`},
		{[]string{"cost", "tiny-llama", "--attention", "sdpa2"}, true, `--attention: unknown value "sdpa2"`},
		{[]string{"cost", "tiny-llama", "--sdpa-layout", "packed"}, true, `--sdpa-layout: unknown value "packed"`},
		{[]string{"run", "llama-3-8b", "--budget", "200GiB", "--profile", "torch-eager"}, false, "more than the 4294967296 the CPU executor runs: try a tiny model"},
		{[]string{"run", "smollm-135m", "--seq", "64", "--budget", "5GiB"}, false, "plans for transformers on PyTorch 2, which run does not execute"},
		{[]string{"export", "tiny-llama", "--lora-rank", "4", "--lora-targets", "q,k,v,o", "--budget", "1.6MiB", "--solver", "optimal", "--to", "json"}, false, "tiny-llama does not fit in 1.60 MiB with the optimal solver: it needs at least 1.61 MiB (1687464 bytes)"},
		{[]string{"export", "tiny-llama", "--lora-rank", "4", "--lora-targets", "q,k,v,o", "--budget", "1.6MiB", "--solver", "optimal", "--runtime", "nested", "--to", "json"}, false, "the optimal plan peaks at 1.61 MiB (1687464 bytes), more than the 1.60 MiB budget: it was planned for a runtime that reruns layers from an earlier checkpoint, which they cannot; plan without --runtime nested, or export with a budget of at least 1.61 MiB"},
		{[]string{"export", "tiny-llama", "--lora-rank", "4", "--lora-targets", "q,k,v,o", "--budget", "1.6MiB", "--solver", "revolve", "--to", "pytorch"}, false, "more than the 1.60 MiB budget: its schedule reruns layers from an earlier checkpoint, which they cannot; plan with --solver selective or optimal"},
		{[]string{"run", "../../graphio/testdata/chains/mlp4.yaml", "--budget", "64MiB"}, false, "is a profiled chain"},
		{[]string{"run", "tiny-gpt2", "--budget", "64MiB", "--tp", "2"}, false, "the executor runs one device"},
		{[]string{"export", "tiny-llama", "--budget", "5MiB"}, true, "export: need --to pytorch, fsdp2, hf, megatron, torchtitan, deepspeed or json"},
		{[]string{"export", "tiny-llama", "--budget", "5MiB", "--to", "jax"}, true, ""},
		{[]string{"export", "tiny-llama", "--lora-rank", "4", "--lora-targets", "q,k,v,o", "--budget", "1.6MiB", "--runtime", "nested", "--to", "megatron"}, false, "no Megatron-LM recomputation setting (none, selective of any modules, or block with 1 to 4 layers) fits in 1.60 MiB, though the selective plan does"},
		{[]string{"export", "../../graphio/testdata/chains/mlp4.yaml", "--budget", "64MiB", "--to", "hf"}, false, "has no layers.N stages"},
		{[]string{"export", "tiny-llama", "--budget", "1MiB", "--to", "hf"}, false, "does not fit in 1 MiB"},
		{[]string{"export", "tiny-llama", "--lora-rank", "4", "--lora-targets", "q,k,v,o", "--budget", "1.6MiB", "--runtime", "nested", "--to", "torchtitan"}, false, "no torchtitan setting (none, full, selective every 2 to 4 layers, or op) fits in 1.60 MiB, though the selective plan does"},
		{[]string{"export", "tiny-llama", "--lora-rank", "4", "--lora-targets", "q,k,v,o", "--budget", "1.6MiB", "--runtime", "nested", "--to", "deepspeed"}, false, "no DeepSpeed setting (no layer checkpointed, or the first 1 to 4) fits in 1.60 MiB, though the selective plan does"},
		{[]string{"export", "missing-plan.json", "--to", "hf"}, false, "missing-plan.json"},
		// Training flags change a model's setup; a graph or chain has none.
		{[]string{"cost", "../../graphio/testdata/graphs/traced.yaml", "--optimizer", "paged-adamw8bit", "--zero", "3"}, true,
			"traced.yaml is a traced graph: its ops are what the model ran; trace it again set up that way; training flags (--zero) apply to models and config.json files only"},
		{[]string{"plan", "../../graphio/testdata/chains/mlp4.yaml", "--budget", "64MiB", "--lora-rank", "4"}, true, "is a profiled chain: its costs are given; training flags (--lora-rank) apply to"},
		{[]string{"sweep", "../../graphio/testdata/graphs/resmlp.yaml", "--quant", "nf4"}, true, "is an explicit graph"},
		{[]string{"cost", "tiny-llama", "--lora-rank", "4", "--quant", "none", "--double-quant"}, true, "--double-quant quantizes 4-bit weights' constants"},
		{[]string{"cost", "tiny-llama", "--lora-rank", "4", "--lora-targets", "q_proj,lm_head"}, true, `--lora-targets: "lm_head" names no linear of a llama decoder layer (q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj)`},
		{[]string{"plan", "../../graphio/testdata/hf", "--budget", "1GiB"}, false, "testdata/hf: a folder without config.json"},
		// Pipelines.
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "0"}, true, "--pp must be positive"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--microbatches", "4"}, true, "--microbatches needs --pp"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--microbatches", "-1"}, true, "--microbatches must be positive"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--pp-layers", "2,x"}, true, `--pp-layers: "x" is not a positive layer count`},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--timeline", "t.svg"}, true, "--timeline draws one device's schedule"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "8"}, false, "4 decoder layers cannot fill 8 pipeline chunks"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--pp-layers", "1,2"}, false, "the layer counts add up to 3, but the model has 4 decoder layers"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--virtual-stages", "2"}, false, "2 virtual stages need the interleaved schedule"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--pp-schedule", "gpipe"}, true, `--pp-schedule: unknown value "gpipe" (valid: 1f1b, interleaved)`},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--microbatches", "3", "--pp-schedule", "interleaved", "--virtual-stages", "2"}, false, "3 microbatches is not a multiple"},
		{[]string{"plan", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--solver", "revolve"}, false, "the revolve solver plans one schedule of the whole chain"},
		{[]string{"plan", "tiny-llama", "--budget", "2MiB", "--pp", "2"}, false, "tiny-llama does not fit in 2 MiB a device with the selective solver on 2 pipeline stages: stage 0 (static memory 2.01 MiB passes the budget alone, most of it optimizer state (1.00 MiB), at least 2.60 MiB in all); stage 1 (static memory 2.01 MiB passes the budget alone, most of it optimizer state (1.00 MiB), at least 2.56 MiB in all); --lora-rank 16 --dp 2 without --pp and the pipeline's other flags fits, the same 4 sequences a step (LoRA r16, adamw-fused, DDP over 2: peak 1.99 MiB"},
		{[]string{"plan", "../../graphio/testdata/chains/mlp4.yaml", "--budget", "64MiB", "--pp", "2"}, false, "is a profiled chain: pipeline parallelism needs a model's layers"},
		{[]string{"compare", "tiny-llama", "--budget", "5MiB", "--pp", "2"}, true, ""},
		{[]string{"export", "tiny-llama", "--budget", "5MiB", "--pp", "2", "--to", "hf"}, true, "export --pp writes Megatron-LM's pipeline flags: use --to megatron"},
		// The engine that runs ZeRO: the export's, or refused.
		{[]string{"plan", "tiny-llama", "--budget", "8MiB", "--sharding", "deepspeed"}, false, "training.parallel.sharding: deepspeed runs ZeRO: set parallel.zero to 1, 2 or 3"},
		{[]string{"plan", "tiny-llama", "--budget", "8MiB", "--dp", "2", "--zero", "2", "--sharding", "fsdp2"}, false, "training.parallel.sharding: fsdp2 (fully_shard) runs ZeRO stage 3, not 2"},
		{[]string{"plan", "tiny-llama", "--budget", "8MiB", "--dp", "2", "--zero", "3", "--sharding", "zero-infinity"}, false, `training.parallel.sharding: unknown value "zero-infinity" (valid: deepspeed, fsdp2)`},
		{[]string{"export", "tiny-llama", "--budget", "8MiB", "--dp", "2", "--zero", "3", "--sharding", "fsdp2", "--to", "deepspeed"}, true, "export --to deepspeed runs ZeRO 3 on deepspeed, but the plan is for fsdp2: plan with --sharding deepspeed"},
		{[]string{"export", "tiny-llama", "--budget", "8MiB", "--dp", "2", "--zero", "3", "--sharding", "deepspeed", "--to", "fsdp2"}, true, "export --to fsdp2 runs ZeRO 3 on fsdp2, but the plan is for deepspeed"},
		{[]string{"export", "tiny-llama", "--budget", "8MiB", "--dp", "2", "--zero", "1", "--to", "torchtitan"}, true, "export --to torchtitan shards with fully_shard, ZeRO 3, but the plan is for ZeRO 1: plan with --zero 3"},
		{[]string{"export", "tiny-llama", "--budget", "1MiB", "--pp", "2", "--to", "megatron"}, false, "does not fit in 1 MiB a device"},
		{[]string{"fit", "../../graphio/testdata/chains/mlp4.yaml", "--budget", "64MiB"}, true, "fit varies a model's batch and sequence, which a graph or profiled chain fixes"},
		{[]string{"fit", "tiny-llama", "--budget", "8MiB", "--gpus", "3", "--global-batch", "8"}, true, "--global-batch 8 does not divide over 3 GPUs"},
		{[]string{"fit", "tiny-llama", "--budget", "8MiB", "--seq-multiple", "0"}, true, "--seq-multiple must be positive, got 0"},
		{[]string{"fit", "tiny-llama", "--budget", "8MiB", "--gpus", "-2"}, true, "--gpus must be positive, got -2"},
		{[]string{"fit", "tiny-llama"}, true, "fit: need --budget or --device"},
		{[]string{"fit", "tiny-gpt2", "--budget", "1GiB", "--seq-multiple", "2048"}, true, "--seq-multiple 2048 is longer than the longest sequence searched, 128"},
		{[]string{"plan", "tiny-llama", "--budget", "6MiB", "--roofline", "matrix=1,bandwidth=1"}, false, "past what ckptplan counts in picoseconds"},
		{[]string{"fit", "tiny-llama", "--budget", "8MiB", "--global-batch", "2305843009213693951"}, true, "--global-batch and --gpus are at most 1073741824"},
		{[]string{"plan", "tiny-llama", "--budget", "1MiB", "--pp", "2"}, false, "stage 1 (static memory 2.01 MiB passes the budget alone, most of it optimizer state (1.00 MiB), at least 2.56 MiB in all); --lora-rank 16 --quant nf4 --double-quant --dp 2 --no-sync --batch 1 --grad-accum 2 without --pp and the pipeline's other flags fits"},
		{[]string{"plan", "tiny-llama", "--budget", "8MiB", "--objective", "time"}, true, "--objective time prices each op on a device's figures: give a --device ckptplan knows"},
		{[]string{"plan", "tiny-llama", "--device", "24GiB", "--objective", "time"}, true, "--objective time prices each op on a device's figures"},
		{[]string{"plan", "tiny-llama", "--budget", "8MiB", "--objective", "seconds"}, true, `--objective: unknown value "seconds" (valid: time, flops)`},
		{[]string{"plan", "tiny-llama", "--budget", "8MiB", "--objective", "flops", "--roofline", "matrix=1e9,bandwidth=1e9"}, true, "--roofline prices time: it does not apply with --objective flops"},
	}
	for _, tt := range tests {
		t.Run(strings.Join(tt.args, " "), func(t *testing.T) {
			_, _, err := runCmd(tt.args...)
			if err == nil {
				t.Fatal("no error")
			}
			var u *usageError
			isUsage := errors.As(err, &u) || errors.Is(err, errUsageShown)
			if isUsage != tt.usage {
				t.Errorf("usage error = %v, want %v (%v)", isUsage, tt.usage, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

// TestExportSavedPlan: exporting a saved JSON plan gives what exporting
// the model with the same flags gives: the plan is verified against the
// model, which also says what it holds run layer by layer.
func TestExportSavedPlan(t *testing.T) {
	plan, _, err := runCmd("plan", "tiny-llama", "--budget", "5MiB", "--format", "json")
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "plan.json")
	if err := os.WriteFile(path, []byte(plan), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, to := range []string{"pytorch", "hf"} {
		fromPlan, _, err := runCmd("export", path, "--to", to)
		if err != nil {
			t.Fatal(err)
		}
		direct, _, err := runCmd("export", "tiny-llama", "--budget", "5MiB", "--to", to)
		if err != nil {
			t.Fatal(err)
		}
		strip := func(s string) string { // the command line in the header differs
			i := strings.Index(s, "\n#   ckptplan ")
			return s[:i] + s[i+1+strings.Index(s[i+1:], "\n"):]
		}
		if to == "pytorch" {
			fromPlan, direct = strip(fromPlan), strip(direct)
		}
		if to == "hf" && strings.Contains(direct, "cheapest plan of whole layers") {
			// From the model, the export can plan whole layers instead of
			// the selective ones (TestHFExportWholeLayers); a saved plan
			// has no model to plan with, and checkpoints them whole.
			if !strings.Contains(fromPlan, "so they are checkpointed whole here") {
				t.Errorf("--to hf of the saved plan:\n%s\nwant its selective layers checkpointed whole", fromPlan)
			}
			continue
		}
		if fromPlan != direct {
			t.Errorf("--to %s: the saved plan exports differently:\n%s\n---\n%s", to, fromPlan, direct)
		}
	}
}

// TestExportSavedPlanSettings: a saved plan that no setting of an engine
// runs is refused (the closest setting needs the model to plan), one that
// a setting runs is written.
func TestExportSavedPlanSettings(t *testing.T) {
	for _, tt := range []struct {
		solver, to, want string
		fails            bool
	}{
		{"selective", "torchtitan", "cannot be written as torchtitan's activation checkpointing: selective layers.0–3; export from the model", true},
		{"every-k", "torchtitan", "mode = \"full\"", false},
		{"selective", "megatron", "cannot be written as Megatron-LM flags: Megatron applies one granularity to every layer", true},
		{"every-k", "megatron", "--recompute-method block --recompute-num-layers 4", false},
		{"selective", "deepspeed", "cannot be run by DeepSpeed's activation checkpointing: selective layers.0–3; export from the model", true},
		{"every-k", "deepspeed", "\"number_checkpoints\": 4", false},
	} {
		plan, _, err := runCmd("plan", "tiny-llama", "--budget", "4.5MiB", "--solver", tt.solver, "--format", "json")
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(t.TempDir(), "plan.json")
		if err := os.WriteFile(path, []byte(plan), 0o644); err != nil {
			t.Fatal(err)
		}
		out, _, err := runCmd("export", path, "--to", tt.to)
		if tt.fails {
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("%s to %s: error %v, want it to contain %q", tt.solver, tt.to, err, tt.want)
			}
			continue
		}
		if err != nil || !strings.Contains(out, tt.want) {
			t.Errorf("%s to %s: %v\n%s", tt.solver, tt.to, err, out)
		}
	}
}

// TestExportSharder: a ZeRO 3 plan is for the engine that runs it. The
// DeepSpeed export plans for DeepSpeed (its gradient bucket, held all
// step, in the peak) unless told otherwise, and a saved plan for FSDP2 is
// refused by it, for DeepSpeed by the FSDP2 export; the JSON export keeps
// the stage's engine.
func TestExportSharder(t *testing.T) {
	flags := []string{"tiny-llama", "--budget", "8MiB", "--dp", "2", "--zero", "3", "--solver", "none"}
	peak := func(args ...string) string {
		t.Helper()
		_, stderr, err := runCmd(append([]string{"export"}, args...)...)
		if err != nil {
			t.Fatal(err)
		}
		return regexp.MustCompile(`peak [0-9.]+ [KMG]iB`).FindString(stderr)
	}
	peaks := map[string]int64{}
	plan := func(sharding string) string {
		t.Helper()
		out, _, err := runCmd(append(append([]string{"plan"}, flags...), "--sharding", sharding, "--format", "json")...)
		if err != nil {
			t.Fatal(err)
		}
		var p struct {
			PeakBytes int64 `json:"peak_bytes"`
		}
		if err := json.Unmarshal([]byte(out), &p); err != nil {
			t.Fatal(err)
		}
		peaks[sharding] = p.PeakBytes
		path := filepath.Join(t.TempDir(), sharding+".json")
		if err := os.WriteFile(path, []byte(out), 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	if got, want := peak(append(flags, "--to", "deepspeed")...), peak(append(flags, "--sharding", "deepspeed", "--to", "deepspeed")...); got != want || got == "" {
		t.Errorf("--to deepspeed: %q, want DeepSpeed's %q", got, want)
	}
	ds, fsdp := plan("deepspeed"), plan("fsdp2")
	if peaks["deepspeed"] <= peaks["fsdp2"] {
		t.Errorf("peaks %v: DeepSpeed's holds its bucket more", peaks)
	}
	for _, tt := range []struct{ path, to, want string }{
		{fsdp, "deepspeed", "the plan is for fsdp2"},
		{ds, "fsdp2", "the plan is for deepspeed"},
		{ds, "torchtitan", "the plan is for deepspeed"},
	} {
		if _, _, err := runCmd("export", tt.path, "--to", tt.to); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s to %s: %v, want an error saying %q", filepath.Base(tt.path), tt.to, err, tt.want)
		}
	}
	if _, _, err := runCmd("export", fsdp, "--to", "fsdp2"); err != nil {
		t.Errorf("fsdp2 to fsdp2: %v", err)
	}
}

// TestExportDeepSpeed: DeepSpeed's config on stdout, what to checkpoint
// beside it on stderr (JSON has no comments): the plan's own layers when
// DeepSpeed runs them, else the closest setting with its peak and cost.
func TestExportDeepSpeed(t *testing.T) {
	for _, tt := range []struct {
		name string
		args []string
	}{
		{"export-deepspeed", []string{"--solver", "every-k"}},
		{"export-deepspeed-optimal", []string{"--solver", "optimal"}},
		{"export-deepspeed-closest", nil},
		// ZeRO 2 (the last --zero wins): the gradient bucket of a layer.
		{"export-deepspeed-zero2", []string{"--solver", "every-k", "--zero", "2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"export", "llama-3-8b", "--device", "h100-80gb", "--seq", "8192", "--dp", "8", "--zero", "3", "--to", "deepspeed"}, tt.args...)
			out, errOut, err := runCmd(args...)
			if err != nil {
				t.Fatal(err)
			}
			golden(t, "plan/"+tt.name+".stdout", out)
			golden(t, "plan/"+tt.name+".stderr", errOut)
		})
	}
}

func TestHelp(t *testing.T) {
	out, _, err := runCmd("help")
	if err != nil || !strings.Contains(out, "inspect") {
		t.Errorf("help: %v\n%s", err, out)
	}
	if _, errOut, err := runCmd("inspect", "-h"); err != nil || !strings.Contains(errOut, "--seq") && !strings.Contains(errOut, "-seq") {
		t.Errorf("inspect -h: %v\n%s", err, errOut)
	}
}

// TestModelTypes checks that 'models --model-types' lists exactly the
// model types whose config.json the reader builds: each listed one gets
// past the model_type check, and one not listed is refused.
func TestModelTypes(t *testing.T) {
	out, _, err := runCmd("models", "--model-types")
	if err != nil {
		t.Fatal(err)
	}
	types := strings.Fields(out)
	if len(types) < 13 || !slices.IsSorted(types) {
		t.Fatalf("model types %q: want the sorted list of builders", types)
	}
	dir := t.TempDir()
	for _, mt := range append(types, "olmo") {
		path := filepath.Join(dir, mt+".json")
		if err := os.WriteFile(path, []byte(`{"model_type": "`+mt+`"}`), 0o644); err != nil {
			t.Fatal(err)
		}
		_, _, err := runCmd("cost", path)
		refused := err != nil && strings.Contains(err.Error(), "no builder for model_type")
		if want := mt == "olmo"; refused != want {
			t.Errorf("model_type %s: refused as having no builder: %v, want %v (%v)", mt, refused, want, err)
		}
	}
}

// TestModelTypesForRelease checks that 'models --model-types --transformers
// R' lists the types whose config.json plans for R: from 5.0 each mixture
// of experts is left out, and planning one for that release is refused
// with the advice to trace it; a release before 4.46 is a usage error.
func TestModelTypesForRelease(t *testing.T) {
	all, _, err := runCmd("models", "--model-types")
	if err != nil {
		t.Fatal(err)
	}
	experts := map[string]string{
		"mixtral":   `, "num_local_experts": 4, "num_experts_per_tok": 2`,
		"qwen2_moe": `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64`,
		"qwen3_moe": `, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 32`,
	}
	dir := t.TempDir()
	for _, release := range []string{"4.46", "4.57", "5.0", "5.24"} {
		out, _, err := runCmd("models", "--model-types", "--transformers", release)
		if err != nil {
			t.Fatalf("%s: %v", release, err)
		}
		listed := strings.Fields(out)
		for _, mt := range strings.Fields(all) {
			path := filepath.Join(dir, mt+".json")
			config := `{"model_type": "` + mt + `", "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 256` + experts[mt] + `}`
			if mt == "gpt2" {
				config = `{"model_type": "gpt2", "n_layer": 2, "n_embd": 64, "n_head": 4, "vocab_size": 256}`
			}
			if err := os.WriteFile(path, []byte(config), 0o644); err != nil {
				t.Fatal(err)
			}
			_, _, err := runCmd("cost", "--transformers", release, path)
			if slices.Contains(listed, mt) {
				if err != nil {
					t.Errorf("transformers %s, model_type %s: listed, but: %v", release, mt, err)
				}
			} else if err == nil || !strings.Contains(err.Error(), "ckptplan trace") {
				t.Errorf("transformers %s, model_type %s: not listed, and planned with %v, want the advice to trace it", release, mt, err)
			}
		}
	}
	if _, _, err := runCmd("models", "--model-types", "--transformers", "4.40"); exitCode(err) != 2 {
		t.Errorf("--transformers 4.40: %v, want a usage error", err)
	}
	if _, _, err := runCmd("models", "--transformers", "5.24"); exitCode(err) != 2 {
		t.Errorf("--transformers without --model-types: %v, want a usage error", err)
	}
}

// exitCode is the status main exits with for err.
func exitCode(err error) int {
	var u *usageError
	switch {
	case err == nil:
		return 0
	case errors.As(err, &u) || errors.Is(err, errUsageShown):
		return 2
	}
	return 1
}

// TestErrorReports: the errors a program reads (CKPTPLAN_ERRORS=json) say
// what kind each is, an infeasible plan's least budget and an input
// error's place, as the text says them.
func TestErrorReports(t *testing.T) {
	falcon := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(falcon, []byte(`{"model_type": "falcon", "hidden_size": 64}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		args []string
		want errorReport
	}{
		{[]string{"plan", "tiny-llama", "--budget", "lots"}, errorReport{Kind: "usage"}},
		{[]string{"plan", "tiny-llama"}, errorReport{Kind: "usage", Message: "plan: need --budget or --device"}},
		{[]string{"plan", "tiny-llama", "--budget", "4.2MiB"}, errorReport{Kind: "infeasible", MinBudgetBytes: -1}},
		{[]string{"plan", "tiny-llama", "--budget", "1MiB", "--solver", "every-k"}, errorReport{Kind: "infeasible", MinBudgetBytes: -1}},
		{[]string{"plan", "tiny-llama", "--budget", "1MiB", "--pp", "2"}, errorReport{Kind: "infeasible", MinBudgetBytes: -1}},
		{[]string{"inspect", "../../graphio/testdata/bad/model-typo.yaml"}, errorReport{Kind: "input", File: "../../graphio/testdata/bad/model-typo.yaml", Line: 5, Column: 1}},
		{[]string{"inspect", "no-such-model"}, errorReport{Kind: "input"}},
		// What only a trace plans: a model_type with no builder, and a
		// mixture of experts as transformers 5 runs it.
		{[]string{"inspect", falcon}, errorReport{Kind: "needs_trace", File: falcon, Line: 1, Column: 16}},
		{[]string{"plan", "../../graphio/testdata/hf/mixtral-8x7b.json", "--budget", "1TiB", "--transformers", "5.0"}, errorReport{Kind: "needs_trace"}},
		{[]string{"plan", "../../graphio/testdata/hf/mixtral-8x7b.json", "--budget", "1TiB", "--transformers", "4.57", "--lora-rank", "-1"}, errorReport{Kind: "input"}},
	} {
		_, _, err := runCmd(tt.args...)
		if err == nil {
			t.Errorf("%v: no error", tt.args)
			continue
		}
		got := reportOf(err)
		if got.Kind != tt.want.Kind || tt.want.Message != "" && got.Message != tt.want.Message || got.Message != err.Error() ||
			got.File != tt.want.File || got.Line != tt.want.Line || got.Column != tt.want.Column {
			t.Errorf("%v: %+v, want %+v", tt.args, got, tt.want)
		}
		switch want := tt.want.MinBudgetBytes; {
		case want > 0 && got.MinBudgetBytes != want, want < 0 && got.MinBudgetBytes <= 0, want == 0 && got.MinBudgetBytes != 0:
			t.Errorf("%v: least budget %d, want %d (-1: some)", tt.args, got.MinBudgetBytes, want)
		}
		if got.Kind == "infeasible" {
			// The least budget it names fits, and a byte less does not.
			args := slices.Clone(tt.args)
			at := slices.Index(args, "--budget") + 1
			args[at] = strconv.FormatInt(got.MinBudgetBytes, 10)
			if _, _, err := runCmd(args...); err != nil {
				t.Errorf("%v: %v", args, err)
			}
			args[at] = strconv.FormatInt(got.MinBudgetBytes-1, 10)
			if _, _, err := runCmd(args...); err == nil || reportOf(err).Kind != "infeasible" {
				t.Errorf("%v: %v, want it not to fit", args, err)
			}
		}
	}
	var b bytes.Buffer
	writeErrorReport(&b, errorReport{Kind: "input", Message: "a.yaml: \"x\" <y>", File: "a.yaml", Line: 2})
	if got, want := b.String(), `{"kind":"input","message":"a.yaml: \"x\" \u003cy\u003e","file":"a.yaml","line":2}`+"\n"; got != want {
		t.Errorf("report %q, want %q", got, want)
	}
}

// TestExportSavedPlanOfFile: a plan of a model file finds the file again,
// by its path or beside the plan, while its bytes are the ones planned:
// then a tampered figure is refused; once the file changed, the plan is
// checked against itself only, and the export says so.
func TestExportSavedPlanOfFile(t *testing.T) {
	dir := t.TempDir()
	model, ok := models.Read("tiny-llama")
	if !ok {
		t.Fatal("no tiny-llama")
	}
	path := filepath.Join(dir, "m.yaml")
	if err := os.WriteFile(path, model, 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, e := runCmd("plan", path, "--budget", "5MiB", "--format", "json")
	if e != nil {
		t.Fatal(e)
	}
	var plan map[string]any
	if err := json.Unmarshal([]byte(out), &plan); err != nil {
		t.Fatal(err)
	}
	plan["cost"] = plan["cost"].(float64) / 2
	data, _ := json.Marshal(plan)
	tampered := filepath.Join(dir, "tampered.json")
	if err := os.WriteFile(tampered, data, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, _, e := runCmd("export", tampered, "--to", "json"); e == nil || !strings.Contains(e.Error(), "the plan does not match its model "+path+": cost is") {
		t.Errorf("tampered: %v", e)
	}
	if err := os.WriteFile(path, append(model, "# edited\n"...), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, stderr, e := runCmd("export", tampered, "--to", "json"); e != nil || !strings.Contains(stderr, "is not here as it was, so its figures were checked against one another") {
		t.Errorf("model edited: %v, %q", e, stderr)
	}
}

// TestBudgetWithoutUnit checks that a bare number under a mebibyte is
// refused as a size that lost its unit, and one from a mebibyte on taken
// as bytes.
func TestBudgetWithoutUnit(t *testing.T) {
	_, stderr, err := runCmd("plan", "tiny-llama", "--budget", "24")
	if !errors.Is(err, errUsageShown) {
		t.Fatalf("err = %v, want a usage error", err)
	}
	if want := "24 is 24 bytes, which no model fits in: give the unit (24GiB), or write 24B for bytes"; !strings.Contains(stderr, want) {
		t.Errorf("stderr = %q, want it to contain %q", stderr, want)
	}
	if _, _, err := runCmd("plan", "tiny-llama", "--budget", "16777216"); err != nil {
		t.Errorf("--budget 16777216: %v", err)
	}
}

// TestHFExportWholeLayers checks that where the plan keeps part of its
// layers, which transformers' checkpointing cannot, export --to hf writes
// the optimal solver's plan of whole layers when it costs less than
// checkpointing those layers whole, and says what each costs.
func TestHFExportWholeLayers(t *testing.T) {
	args := []string{"tiny-llama", "--budget", "4.5MiB"}
	hf, _, err := runCmd(append([]string{"export", "--to", "hf"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	optimal, _, err := runCmd(append([]string{"plan", "--solver", "optimal"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	selective, _, err := runCmd(append([]string{"export", "--to", "json"}, args...)...)
	if err != nil {
		t.Fatal(err)
	}
	var plan struct {
		Overhead float64 `json:"overhead"`
		Layers   []struct{ Mode string }
	}
	if err := json.Unmarshal([]byte(selective), &plan); err != nil {
		t.Fatal(err)
	}
	if plan.Layers[0].Mode != "selective" {
		t.Fatalf("the plan's first layer is %s: pick a budget where it is selective", plan.Layers[0].Mode)
	}
	// The optimal plan: "... 14.4% extra compute", and its checkpointed layers.
	m := regexp.MustCompile(`: ([0-9.]+)% extra compute`).FindStringSubmatch(optimal)
	if m == nil {
		t.Fatalf("no overhead in\n%s", optimal)
	}
	want := fmt.Sprintf("cannot: this is the cheapest plan of whole layers in its budget, +%s%% compute", m[1])
	if !strings.Contains(hf, want) {
		t.Errorf("export --to hf:\n%s\nwant it to contain %q", hf, want)
	}
	if over, _ := strconv.ParseFloat(m[1], 64); over >= 100*plan.Overhead {
		t.Errorf("the whole-layer plan costs %v%%, no less than the selective plan checkpointed whole", over)
	}
	if !strings.Contains(hf, "CHECKPOINTED = {0, 2}") {
		t.Errorf("export --to hf:\n%s\nwant the optimal plan's layers 0 and 2 checkpointed", hf)
	}
}

// TestTransformersAttentionNames: --attention takes transformers' names
// for its implementations, planned as ckptplan's own.
func TestTransformersAttentionNames(t *testing.T) {
	for _, tt := range []struct{ theirs, ours string }{{"flash_attention_2", "flash"}, {"flash_attention_3", "flash"}, {"sdpa", "sdpa"}, {"eager", "eager"}} {
		want, _, err := runCmd("cost", "tiny-llama", "--attention", tt.ours, "--format", "json")
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := runCmd("cost", "tiny-llama", "--attention", tt.theirs, "--format", "json")
		if err != nil {
			t.Fatalf("--attention %s: %v", tt.theirs, err)
		}
		if got != want {
			t.Errorf("--attention %s plans otherwise than --attention %s", tt.theirs, tt.ours)
		}
	}
	if _, _, err := runCmd("cost", "tiny-llama", "--attention", "flex_attention"); err == nil || !strings.Contains(err.Error(), "--attention") {
		t.Errorf("flex_attention: error %v", err)
	}
}

// TestPlanSaysWhatTheExportPays: under the torch-eager profile a plan's
// text gives the overhead its exports count for PyTorch beside its own,
// the figure export --to json writes.
func TestPlanSaysWhatTheExportPays(t *testing.T) {
	text, _, err := runCmd("plan", "tiny-llama", "--budget", "5MiB")
	if err != nil {
		t.Fatal(err)
	}
	out, _, err := runCmd("export", "tiny-llama", "--budget", "5MiB", "--to", "json")
	if err != nil {
		t.Fatal(err)
	}
	var e struct{ Overhead float64 }
	if err := json.Unmarshal([]byte(out), &e); err != nil {
		t.Fatal(err)
	}
	want := fmt.Sprintf("(the torch-eager profile's): %.1f%% extra compute", 100*e.Overhead)
	if e.Overhead <= 0 || !strings.Contains(text, want) {
		t.Errorf("plan's text does not say %q:\n%s", want, text)
	}
}

// TestFitFlagsPlanTheRow runs plan with each fitting row's printed flags:
// the plan fits, at the row's peak and extra cost, pipelines included, in
// FLOPs and in time (on --roofline and on a named device); a pipeline's
// step is the row's time a sequence
// over its sequences and GPUs, its data-parallel collectives included
// over 16 GPUs (TP 4, PP 2, ZeRO 1 over 2); a pipeline's solver, where
// not the one fit was given, is among its flags.
func TestFitFlagsPlanTheRow(t *testing.T) {
	for _, tc := range []struct {
		gpus string
		base []string
	}{
		{"4", []string{"tiny-llama", "--budget", "6MiB"}},
		{"4", []string{"tiny-llama", "--budget", "6MiB", "--roofline", "matrix=1e12,bandwidth=1e11,link=1e9"}},
		{"4", []string{"tiny-llama", "--device", "h100-80gb", "--budget", "6MiB", "--reserve", "0"}},
		{"16", []string{"tiny-llama", "--budget", "6MiB", "--roofline", "matrix=1e12,bandwidth=1e11,link=1e9"}},
		{"4", []string{"tiny-llama", "--budget", "6MiB", "--roofline", "matrix=1e12,bandwidth=1e11,link=1e9", "--solver", "megatron-selective"}},
	} {
		base := tc.base
		args := append([]string{"fit"}, base...)
		args = append(args, "--gpus", tc.gpus, "--global-batch", "16")
		text, _, err := runCmd(args...)
		if err != nil {
			t.Fatal(err)
		}
		js, _, err := runCmd(append(args, "--format", "json")...)
		if err != nil {
			t.Fatal(err)
		}
		var fit struct {
			Settings []struct {
				Name      string  `json:"name"`
				Fits      bool    `json:"fits"`
				PeakBytes int64   `json:"peak_bytes"`
				Overhead  float64 `json:"overhead"`
				PerSeq    float64 `json:"cost_per_sequence"`
				Setup     struct {
					Parallel struct {
						TP int64 `json:"tp"`
					} `json:"parallel"`
				} `json:"setup"`
			} `json:"settings"`
		}
		if err := json.Unmarshal([]byte(js), &fit); err != nil {
			t.Fatal(err)
		}
		pipelines, priced := 0, 0
		for _, st := range fit.Settings {
			if !st.Fits {
				continue
			}
			var flags []string
			for _, line := range strings.Split(text, "\n") {
				if strings.HasPrefix(line, st.Name+"  ") {
					if i := strings.Index(line, " --"); i >= 0 {
						flags = strings.Fields(line[i:])
					}
				}
			}
			if strings.Contains(st.Name, "PP") {
				pipelines++
			}
			out, _, err := runCmd(append(append(append([]string{"plan"}, base...), flags...), "--format", "json")...)
			if err != nil {
				t.Errorf("%v: %s: plan %v: %v", base, st.Name, flags, err)
				continue
			}
			var plan struct {
				Feasible  bool    `json:"feasible"`
				PeakBytes int64   `json:"peak_bytes"`
				Overhead  float64 `json:"overhead"`
				Unit      string  `json:"unit"`
				Cost      float64 `json:"cost"`
				CommCost  float64 `json:"comm_cost"`
				Pipeline  struct {
					Stages       int64 `json:"stages"`
					Microbatches int64 `json:"microbatches"`
				} `json:"pipeline"`
				Setup struct {
					Batch int64 `json:"batch"`
				} `json:"setup"`
			}
			if err := json.Unmarshal([]byte(out), &plan); err != nil {
				t.Fatal(err)
			}
			if !plan.Feasible || plan.PeakBytes != st.PeakBytes || math.Abs(plan.Overhead-st.Overhead) > 1e-9 {
				t.Errorf("%v: %s: plan %v fits %v at %d B, %.6f extra; fit says %d B, %.6f", base, st.Name, flags, plan.Feasible, plan.PeakBytes, plan.Overhead, st.PeakBytes, st.Overhead)
			}
			if pp := plan.Pipeline; pp.Stages > 0 && plan.Unit == "ps" {
				step := st.PerSeq * float64(pp.Microbatches*plan.Setup.Batch) / float64(pp.Stages*st.Setup.Parallel.TP)
				if math.Abs(step-plan.Cost) > 1e-9*plan.Cost {
					t.Errorf("%v: %s: plan %v takes %g ps a step; fit's %g ps a sequence makes it %g", base, st.Name, flags, plan.Cost, st.PerSeq, step)
				}
				if plan.CommCost > 0 {
					priced++
				}
			}
		}
		if pipelines == 0 {
			t.Errorf("%v: no pipeline fits", base)
		}
		if tc.gpus == "16" && priced == 0 {
			t.Errorf("%v over %s GPUs: no pipeline's collectives priced", base, tc.gpus)
		}
	}
}
