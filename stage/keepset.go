package stage

import (
	"strconv"
	"strings"

	"github.com/ckptplan/ckptplan/costmodel"
	"github.com/ckptplan/ckptplan/mem"
)

// Policies are the named keep sets, in the order they are listed:
// keep-all, megatron-selective (drop the attention core: QKᵀ, scale, mask,
// softmax, cast, dropout; Korthikanti et al. 2022, §4.2), matmuls-only
// (keep the tensors products and linear layers own, recompute the
// pointwise ops), keep-nothing, and, under the megatron profile,
// Megatron-LM's selective recomputation of its other modules
// (MegatronPolicy), which reruns whole modules as Megatron-LM does.
var Policies = append([]string{"keep-all", "megatron-selective", "matmuls-only", "keep-nothing"}, megatronPolicies()...)

// MegatronPolicy names the keep set of Megatron-LM's selective
// recomputation of modules m (--recompute-granularity selective
// --recompute-modules …): megatron-selective for the attention core alone,
// Megatron-LM's default, else megatron-selective(layernorm,mlp) listing
// the modules.
func MegatronPolicy(m costmodel.Module) string {
	if m == costmodel.CoreAttn {
		return "megatron-selective"
	}
	return "megatron-selective(" + strings.Join(m.Names(), ",") + ")"
}

// MegatronPolicyModules returns the modules of a MegatronPolicy name,
// and whether it is one.
func MegatronPolicyModules(name string) (costmodel.Module, bool) {
	m, ok := megatronModules[name]
	return m, ok
}

// megatronModules maps each MegatronPolicy name to its modules.
var megatronModules = func() map[string]costmodel.Module {
	out := map[string]costmodel.Module{}
	for m := costmodel.Module(1); m <= costmodel.AllModules; m++ {
		out[MegatronPolicy(m)] = m
	}
	return out
}()

// megatronPolicies names every set of modules but the default.
func megatronPolicies() []string {
	var out []string
	for m := costmodel.Module(1); m <= costmodel.AllModules; m++ {
		if m != costmodel.CoreAttn {
			out = append(out, MegatronPolicy(m))
		}
	}
	return out
}

// KeepSet is one way a stage's storing forward may run: which of the
// stage's saved storages it keeps, what the backward reruns first, and
// what that costs.
type KeepSet struct {
	// Name is derived from the content: a policy's name when the keep set
	// is that policy's, else "drop(a,b)" or "keep(a,b)" listing the
	// tensors dropped or kept, whichever list is shorter, in the
	// vocabulary of the model (Stage.TensorName). Identical keep sets of
	// identical stages have the same name.
	Name string
	kept bitset // over Stage.Saved
	// held are storages no op saves for backward that the keep set's
	// runtime holds to the backward all the same (a policy that caches an
	// op's outputs whether or not anything reads them), sorted.
	held []int
	// Named: the keep set is a runtime's own policy, which a plan runs
	// only where asked to (TorchtitanOp); the searches pass it over.
	Named bool
	// Recompute lists the nodes the backward reruns forward first, in
	// graph order.
	Recompute         []int
	TapeBytes         mem.Bytes // what the storing forward keeps, a_{i+1} included
	ExtraFLOPs        int64     // forward FLOPs of Recompute
	FAllTempBytes     mem.Bytes // beyond TapeBytes, during the storing forward
	BackwardTempBytes mem.Bytes // during the backward, its rerun included
}

// Keeps reports whether the keep set keeps saved storage j (an index into
// Stage.Saved).
func (k *KeepSet) Keeps(j int) bool { return k.kept.has(j) }

// Held returns the storages the keep set holds to the backward although
// no op saves them, sorted.
func (k *KeepSet) Held() []int { return k.held }

// Kept returns the names of the saved storages the keep set keeps, in the
// order of Stage.Saved.
func (st *Stage) Kept(k *KeepSet) []string { return st.names(k, true) }

// Dropped returns the names of the saved storages the keep set drops, in
// the order of Stage.Saved.
func (st *Stage) Dropped(k *KeepSet) []string { return st.names(k, false) }

func (st *Stage) names(k *KeepSet, kept bool) []string {
	out := []string{}
	for j, s := range st.Saved {
		if k.Keeps(j) == kept {
			out = append(out, st.TensorName(s))
		}
	}
	return out
}

// KeepSet returns the stage's keep set with the given name, and whether
// there is one.
func (st *Stage) KeepSet(name string) (int, bool) {
	for i := range st.KeepSets {
		if st.KeepSets[i].Name == name {
			return i, true
		}
	}
	return 0, false
}

// contentName names kept flags by what they keep or drop. A tensor name
// that could be read as part of the list (a comma, a parenthesis, a
// quote, a space or a control character in it) is written as a Go-quoted
// string, so that different keep sets never share a name.
func (st *Stage) contentName(b bitset) string {
	k := KeepSet{kept: b}
	kept, dropped := st.Kept(&k), st.Dropped(&k)
	list, verb := dropped, "drop"
	if len(kept) < len(dropped) {
		list, verb = kept, "keep"
	}
	quoted := make([]string, len(list))
	for i, name := range list {
		quoted[i] = name
		if strings.ContainsAny(name, `,()" \`) || strconv.Quote(name) != `"`+name+`"` {
			quoted[i] = strconv.Quote(name)
		}
	}
	return verb + "(" + strings.Join(quoted, ",") + ")"
}

// bitset is a dense set of small integers.
type bitset []uint64

func newBitset(n int) bitset { return make(bitset, (n+63)/64) }

func (b bitset) has(j int) bool { return b[j/64]&(1<<(j%64)) != 0 }
func (b bitset) set(j int)      { b[j/64] |= 1 << (j % 64) }
func (b bitset) clear(j int)    { b[j/64] &^= 1 << (j % 64) }

func (b bitset) key() string {
	var s strings.Builder
	for _, w := range b {
		for k := 0; k < 8; k++ {
			s.WriteByte(byte(w >> (8 * k)))
		}
	}
	return s.String()
}
