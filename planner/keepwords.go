package planner

// Keep sets in words.
//
// A keep set's name lists tensors as the model's graph names them
// (keep(attn.rope_k,attn.sdpa,attn.sdpa:logsumexp,mlp.gate_proj,…)): exact,
// and what the exports and the JSON carry, but not how a person thinks of
// a layer. Words says the same in the terms of a transformer layer —
// "keeps the rotated keys, the attention's output and the MLP's gate and
// up projections" — or, where that reads shorter, what the backward
// recomputes. Each saved tensor is named by the module it belongs to and
// what it is there; the auxiliaries an op saves beside its output (sdpa's
// log-sum-exp and random state, a norm's statistics and fp32 copy) read
// as the op's output, so a tensor and its auxiliaries are one phrase.
// Consecutive things of one module share it ("the MLP's gate and up
// projections"). A name this vocabulary does not know is written as it is.

import (
	"strings"
)

// Words describes the keep set of the stage named stage in words: what
// it keeps for the backward, or what the backward recomputes, whichever
// lists fewer things.
func (k *KeepSet) Words(stage string) string {
	var kept, dropped []phrase
	for _, s := range k.Saved {
		p := tensorPhrase(strings.TrimPrefix(s.Name, stage+"."))
		if s.Keep {
			kept = appendPhrase(kept, p)
		} else {
			dropped = appendPhrase(dropped, p)
		}
	}
	switch {
	case len(dropped) == 0:
		return "keeps everything"
	case len(kept) == 0:
		return "recomputes everything"
	case len(kept) <= len(dropped):
		return "keeps " + joinPhrases(kept)
	}
	return "recomputes " + joinPhrases(dropped)
}

// phrase is one thing a layer saves: the module it belongs to, in the
// possessive ("the MLP's"; empty for the layer's own), and what it is.
type phrase struct{ owner, thing string }

func appendPhrase(ps []phrase, p phrase) []phrase {
	for _, q := range ps {
		if q == p {
			return ps
		}
	}
	return append(ps, p)
}

// modules are the owners of a tensor name's first component.
var modules = map[string]string{
	"attn": "the attention's", "self_attn": "the attention's",
	"mlp": "the MLP's", "moe": "the router's", "moe.experts": "the experts'",
	"moe.shared_expert": "the shared expert's",
}

// things are what a tensor is within its module, by its op's name.
var things = map[string]string{
	// attention
	"q_proj": "query projection", "k_proj": "key projection", "v_proj": "value projection",
	"qkv_proj": "query-key-value projection", "c_attn": "query-key-value projection",
	"o_proj": "output projection", "q_norm": "query norm", "k_norm": "key norm",
	"rope_q": "rotated queries", "rope_k": "rotated keys",
	"repeat_k": "repeated keys", "repeat_v": "repeated values",
	"q_cast": "queries cast", "k_cast": "keys cast", "v_cast": "values cast",
	"sdpa": "output", "av_matmul": "output", "merge": "merged heads",
	"qk_matmul": "scores", "scale": "scaled scores", "softcap_tanh": "capped scores",
	"causal_mask": "masked scores", "softmax_in": "scores", "softmax": "probabilities",
	"softmax_cast": "probabilities", "attn_dropout": "dropped probabilities",
	// MLP
	"gate_proj": "gate projection", "up_proj": "up projection", "gate_up_proj": "gate and up projection",
	"fc1": "input projection", "c_fc": "input projection", "silu": "activation", "gelu": "activation",
	"act": "activation", "mul": "gated product", "down_proj": "down projection", "fc2": "down projection",
	// router and experts
	"dispatch": "dispatched tokens", "route_weights": "routing weights", "norm_topk": "routing weights",
	"topk": "top-k choice", "weighted": "weighted outputs",
	// any module
	"resid_dropout": "dropout mask",
}

// layerThings are a layer's own tensors, outside its modules.
var layerThings = map[string]string{
	"input_layernorm": "the input norm", "ln_1": "the input norm",
	"post_attention_layernorm": "the post-attention norm", "ln_2": "the post-attention norm",
	"pre_feedforward_layernorm": "the pre-MLP norm", "post_feedforward_layernorm": "the post-MLP norm",
	"resid_1": "the residual sum", "dropout": "the dropout mask", "norm_f": "the final norm",
	"logit_softcap_tanh": "the capped logits", "loss": "the loss's log-probabilities",
}

// roles are the tensors an op saves beside its output that read as
// their own thing; every other role reads as the op's output.
var roles = map[string]string{"copy0": "query copy", "copy1": "key copy", "mask": "dropout mask"}

// tensorPhrase is a saved tensor's name in words.
func tensorPhrase(name string) phrase {
	op, role, _ := strings.Cut(name, ":")
	module, base := "", op
	if i := strings.LastIndexByte(op, '.'); i >= 0 {
		module, base = op[:i], op[i+1:]
	}
	if module == "" {
		if t, ok := layerThings[base]; ok {
			return phrase{thing: t}
		}
		return phrase{thing: name}
	}
	owner, ok := modules[module]
	thing, known := things[base]
	if !ok || !known {
		return phrase{thing: name}
	}
	switch {
	case base == "av_matmul" && role == "copy0":
		return phrase{owner, "probabilities copy"}
	case base == "av_matmul" && role == "copy1":
		return phrase{owner, "value copy"}
	case role == "lora_input":
		return phrase{"the LoRA adapters'", "inputs"}
	case role == "lora_a":
		return phrase{"the LoRA adapters'", "hidden states"}
	}
	if r, ok := roles[role]; ok {
		return phrase{owner, r}
	}
	return phrase{owner, thing}
}

// joinPhrases writes phrases as a list, consecutive things of one owner
// sharing it, and things of one kind their last word ("gate and up
// projections").
func joinPhrases(ps []phrase) string {
	var items []string
	for i := 0; i < len(ps); {
		j := i + 1
		for j < len(ps) && ps[j].owner == ps[i].owner && ps[i].owner != "" {
			j++
		}
		things := make([]string, 0, j-i)
		for _, p := range ps[i:j] {
			things = append(things, p.thing)
		}
		item := list(shareLastWord(things))
		if ps[i].owner != "" {
			item = ps[i].owner + " " + item
		}
		items = append(items, item)
		i = j
	}
	if len(items) > 2 && strings.Contains(strings.Join(items, ""), " and ") {
		// An item with an "and" of its own: a comma before the last.
		return strings.Join(items[:len(items)-1], ", ") + ", and " + items[len(items)-1]
	}
	if len(items) == 2 && strings.Contains(items[0], " and ") {
		return items[0] + ", and " + items[1]
	}
	return list(items)
}

// shareLastWord writes things that end in the same word once, with the
// word made plural: gate projection, up projection → gate and up
// projections.
func shareLastWord(things []string) []string {
	if len(things) < 2 {
		return things
	}
	last := func(s string) (string, string) {
		i := strings.LastIndexByte(s, ' ')
		if i < 0 {
			return "", s
		}
		return s[:i], s[i+1:]
	}
	_, word := last(things[0])
	heads := make([]string, len(things))
	for i, t := range things {
		head, w := last(t)
		if w != word || head == "" {
			return things
		}
		heads[i] = head
	}
	return []string{list(heads) + " " + plural(word)}
}

// plural is an English noun's plural, for the nouns things ends in.
func plural(word string) string {
	switch {
	case strings.HasSuffix(word, "s"):
		return word
	case strings.HasSuffix(word, "y"):
		return strings.TrimSuffix(word, "y") + "ies"
	}
	return word + "s"
}

// list joins items as English does: a, b and c.
func list(items []string) string {
	switch len(items) {
	case 0:
		return ""
	case 1:
		return items[0]
	}
	return strings.Join(items[:len(items)-1], ", ") + " and " + items[len(items)-1]
}
