package export

import (
	"slices"
	"testing"

	"github.com/ckptplan/ckptplan/planner"
)

// TestMegatronSplit: Megatron-LM splits layers evenly, or evenly but for
// the first and last stages (--decoder-first/last-pipeline-num-layers);
// the interleaved schedule needs equal chunks.
func TestMegatronSplit(t *testing.T) {
	for _, tt := range []struct {
		layers  []int
		virtual int
		want    string
		err     bool
	}{
		{[]int{12, 12, 12, 12}, 1, "", false},
		{[]int{6, 6, 6, 6}, 2, "--num-layers-per-virtual-pipeline-stage 6", false},
		{[]int{10, 12, 12, 14}, 1, "--decoder-first-pipeline-num-layers 10\n--decoder-last-pipeline-num-layers 14", false},
		{[]int{12, 12, 14}, 1, "--decoder-last-pipeline-num-layers 14", false},
		{[]int{1, 3}, 1, "--decoder-first-pipeline-num-layers 1\n--decoder-last-pipeline-num-layers 3", false},
		{[]int{12, 11, 13, 12}, 1, "", true},
		{[]int{5, 6, 6, 6}, 2, "", true},
	} {
		got, err := megatronSplit(planner.Pipeline{Stages: len(tt.layers) / tt.virtual, Virtual: tt.virtual, Layers: slices.Clone(tt.layers)})
		if (err != nil) != tt.err || got != tt.want {
			t.Errorf("%v (v %d): %q, %v; want %q, error %v", tt.layers, tt.virtual, got, err, tt.want, tt.err)
		}
	}
}
