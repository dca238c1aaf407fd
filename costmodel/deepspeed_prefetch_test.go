package costmodel

import (
	"fmt"
	"testing"

	"github.com/ckptplan/ckptplan/graphio"
	"github.com/ckptplan/ckptplan/ir"
	"github.com/google/go-cmp/cmp"
)

// TestDeepSpeedPrefetch replays small traces by hand, rule by rule, as
// DeepSpeed 0.16's coordinator runs them: three modules of one parameter
// each, called forward then backward (uses 0 to 5), two ranks, 2-byte
// elements, at most 10 parameters live. python/tests/test_deepspeed_zero3
// checks the replay against DeepSpeed itself, block by block.
func TestDeepSpeedPrefetch(t *testing.T) {
	mods := []dsModule{{block: "a", params: []int{0}}, {block: "b", params: []int{1}}, {block: "c", params: []int{2}}}
	trace := deepSpeedTrace(mods, func(string) bool { return false })
	if want := []dsUse{{0, true, false}, {1, true, false}, {2, true, false}, {2, false, false}, {1, false, false}, {0, false, false}}; !cmp.Equal(trace, want, cmp.AllowUnexported(dsUse{})) {
		t.Fatalf("trace %v, want %v", trace, want)
	}
	for _, tt := range []struct {
		name        string
		numel       []int64
		during      []int64
		loss, after int64
		walkthrough string
	}{
		{
			name: "one parameter a gather", numel: []int64{8, 4, 6},
			during: []int64{48, 20, 20, 20, 24, 16}, loss: 20,
			walkthrough: `The model's own call prefetches a (8) and b (4): one flat buffer of
			(4+2)·2 elements, 24 B. a's fetch waits for it, copying both out
			(+24 B): 48. a's release frees its copy; b's fetch frees the flat
			buffer, its last parameter waited for (8 B left), and prefetches c
			alone (6 of the 6 max-live leaves): its own padded buffer, 12 B, 20.
			c's prefetch pops c's backward use (already gathered) and b's,
			gathered apart: 20. c is not released (its backward use was
			popped), nor at the loss: 20. c's backward use releases it; b's
			prefetches a (16 B): 24; a's, with nothing left to prefetch, 16.`,
		},
		{
			name: "padded, kept for a later use", numel: []int64{8, 3, 6},
			during: []int64{46, 34, 62, 62, 50, 16}, loss: 62,
			walkthrough: `The first prefetch takes a (8) and b (3, padded to 4): a flat
			buffer of 24 B; a's fetch copies both out (16 + 6 B): 46. a's release
			frees 16. b's fetch frees the flat buffer (6 B left) and, 7 of
			max-live left, pops c (6), c's backward use, b's (available: kept
			for it) and a's backward use (8): one flat buffer of c and a,
			(3+4)·2 elements, 28 B: 34. b is not released. c's fetch copies c
			and a out (12 + 16 B): 62, and keeps c for its backward use: 62 at
			the loss and there. Releasing c leaves 50; b's backward use
			releases b (44); a's frees the flat buffer: 16.`,
		},
	} {
		t.Run(tt.name, func(t *testing.T) {
			during, loss, after := deepSpeedPrefetch(mods, tt.numel, trace, 2, 2, 10)
			if !cmp.Equal(during, tt.during) || loss != tt.loss || after != tt.after {
				t.Errorf("held %v, at the loss %d, after %d; want %v, %d, %d", during, loss, after, tt.during, tt.loss, tt.after)
			}
		})
	}
}

// TestDeepSpeedReduce replays the gradient hooks by hand: the backward of
// three modules with gradients of 6, 3 and 8 elements, two ranks, 2-byte
// elements.
func TestDeepSpeedReduce(t *testing.T) {
	mods := []dsModule{{params: []int{0}}, {params: []int{1}}, {params: []int{2}}}
	numel := []int64{8, 3, 6}
	trace := deepSpeedTrace(mods, func(string) bool { return false })
	for _, tt := range []struct {
		name   string
		bucket int64
		during []int64 // the backward's uses: of c, b, a
		end    int64
	}{
		// c's gradient (12 B) and b's go into the bucket; a's would
		// overflow it: the hook reduces c's and b's first, through a flat
		// buffer of their padded partitions, (6+4)·2 B, beside a's 16 B.
		// The epilogue reduces a's alone: even, no buffer.
		{"in the bucket", 10, []int64{12, 6, 36}, 0},
		// c's is larger than the bucket: held apart (12 B) until b's hook
		// reduces it, one even tensor, in place (12 + 6 B); a's hook
		// reduces b's, padded to 4 elements (8 B), beside its own 16 B,
		// which it holds apart in turn to the epilogue.
		{"larger than the bucket", 5, []int64{12, 18, 24}, 16},
	} {
		t.Run(tt.name, func(t *testing.T) {
			during, end := deepSpeedReduce(mods, numel, trace, 2, 2, tt.bucket)
			if got := during[3:]; !cmp.Equal(got, tt.during) || end != tt.end || during[0]+during[1]+during[2] != 0 {
				t.Errorf("held %v, at the end %d; want forward none, backward %v, %d", during, end, tt.during, tt.end)
			}
		})
	}
}

// TestDeepSpeedGathersLlama: Llama 3 8B in bf16 over 8 ranks under the
// DeepSpeed export's settings (at most a layer's L = 218,112,000
// parameters live and prefetched). In the steady forward each release is
// refilled from a trace that repeats every L parameters, so exactly one
// layer's worth is gathered, each parameter in a buffer of its own: 2L
// bytes in a middle layer. The embedding (525,336,576 parameters, more
// than L) is gathered alone, and the final norm and the head together;
// the head's backward holds its weight gathered and its gradient, too
// large for the bucket, beside it.
func TestDeepSpeedGathersLlama(t *testing.T) {
	src, err := graphio.Load("llama-3-8b")
	if err != nil {
		t.Fatal(err)
	}
	m := *src.Model
	m.Training.Parallel = ir.Parallel{DP: 8, TP: 1, Zero: 3, Sharding: ir.ShardingDeepSpeed}
	c := analyzeModel(t, &m)
	st := c.Static
	d := st.Gather.DeepSpeed
	const layer, embedding = 218112000, 128256 * 4096
	if d == nil || st.LayerParams != layer {
		t.Fatalf("no gathers module by module, or a layer of %d parameters", st.LayerParams)
	}
	for _, tt := range []struct {
		name      string
		got, want int64
	}{
		{"a middle layer's forward", d.Forward["layers.15"], 2 * layer},
		{"the embedding's forward", d.Forward["embed"], 2 * embedding},
		{"the head's forward (the final norm and the head)", d.Forward["head"], 2 * (4096 + embedding)},
		{"the head's backward", d.Reduced["head"], 2 * 2 * embedding},
	} {
		if tt.got != tt.want {
			t.Errorf("%s: %d, want %d", tt.name, tt.got, tt.want)
		}
	}
	// What a plan's own decisions gather, recomputing layers in no
	// period of three, stays within what the eight periodic replays
	// count, block by block.
	for seed := range uint64(16) {
		rng := seed*0x9e3779b97f4a7c15 + 1
		rerun := map[string]bool{}
		for k := range 32 {
			rng ^= rng << 13
			rng ^= rng >> 7
			rng ^= rng << 17
			rerun[fmt.Sprintf("layers.%d", k)] = rng&1 == 1
		}
		under, ok := DeepSpeedGathersUnder(c.Graph, st, func(b string) bool { return rerun[b] })
		if !ok {
			t.Fatal("no replay under a plan's decisions")
		}
		for _, m := range []struct {
			name        string
			under, most map[string]int64
		}{{"forward", under.Forward, d.Forward}, {"recomputation", under.Rerun, d.Rerun}, {"backward", under.Reduced, d.Reduced}} {
			for b, v := range m.under {
				if v > m.most[b] {
					t.Errorf("pattern %d: %s's %s holds %d, more than the plan counts, %d", seed, b, m.name, v, m.most[b])
				}
			}
		}
		if under.Loss > d.Loss || under.End > d.End {
			t.Errorf("pattern %d: the loss %d and the end %d, more than the plan's %d and %d", seed, under.Loss, under.End, d.Loss, d.End)
		}
	}
}
