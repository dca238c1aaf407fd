package graphio

// PEFT's LoRA adapters, as a user names them.
//
// PEFT picks the linears it adapts by module name. A list entry of
// target_modules adapts every module whose dotted name is the entry or
// ends with "." and the entry ("q_proj", "self_attn.q_proj"); a string is
// a regular expression the whole name must match; "all-linear" adapts
// every linear but the output head. Names are a family's own: GPT-2's
// "c_attn" is q, k and v in one linear, its "c_proj" both the attention's
// output and the MLP's down projection, Starcoder 2's "c_proj" only the
// latter.
//
// ckptplan resolves names against the module names of one decoder layer
// as transformers spells them for the family (familyModules), for every
// layer, and records the roles they adapt (ir.LoRATarget). An entry that
// adapts nothing ckptplan builds, a pattern that adapts some layers but
// not others, and what trains besides the adapters (modules_to_save,
// biases, DoRA's magnitudes, per-module ranks) are refused, each named:
// a plan that left them out would promise less memory than the step
// holds.
//
// Where no targets are named, PEFT's defaults for the model type apply
// (TRANSFORMERS_MODELS_TO_LORA_TARGET_MODULES_MAPPING: q and v for Llama
// and its kin, GPT-2's c_attn); for a family PEFT has none for, which
// PEFT refuses without targets, every attention projection. PEFT makes
// the adapters fp32 over 16-bit weights (autocast_adapter_dtype), and so
// does the default setup.

import (
	"encoding/json"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/ckptplan/ckptplan/ir"
	"go.yaml.in/yaml/v3"
)

// peftModule is one linear of a decoder layer: its name under the layer
// as transformers spells it and the roles it answers to.
type peftModule struct {
	path  string
	roles []ir.LoRATarget
}

var (
	llamaModules = []peftModule{
		{"self_attn.q_proj", []ir.LoRATarget{ir.LoRAQ}}, {"self_attn.k_proj", []ir.LoRATarget{ir.LoRAK}},
		{"self_attn.v_proj", []ir.LoRATarget{ir.LoRAV}}, {"self_attn.o_proj", []ir.LoRATarget{ir.LoRAO}},
		{"mlp.gate_proj", []ir.LoRATarget{ir.LoRAGate}}, {"mlp.up_proj", []ir.LoRATarget{ir.LoRAUp}},
		{"mlp.down_proj", []ir.LoRATarget{ir.LoRADown}},
	}
	familyModules = map[string]struct {
		layer   string // a layer's name, with %d for its index
		modules []peftModule
	}{
		"llama": {"model.layers.%d", llamaModules}, "gemma": {"model.layers.%d", llamaModules},
		"gemma2": {"model.layers.%d", llamaModules}, "granite": {"model.layers.%d", llamaModules},
		"qwen3": {"model.layers.%d", llamaModules},
		"gpt2": {"transformer.h.%d", []peftModule{
			{"attn.c_attn", []ir.LoRATarget{ir.LoRAQ, ir.LoRAK, ir.LoRAV}}, {"attn.c_proj", []ir.LoRATarget{ir.LoRAO}},
			{"mlp.c_fc", []ir.LoRATarget{ir.LoRAUp}}, {"mlp.c_proj", []ir.LoRATarget{ir.LoRADown}},
		}},
		"phi3": {"model.layers.%d", []peftModule{
			{"self_attn.qkv_proj", []ir.LoRATarget{ir.LoRAQ, ir.LoRAK, ir.LoRAV}}, {"self_attn.o_proj", []ir.LoRATarget{ir.LoRAO}},
			{"mlp.gate_up_proj", []ir.LoRATarget{ir.LoRAGate, ir.LoRAUp}}, {"mlp.down_proj", []ir.LoRATarget{ir.LoRADown}},
		}},
		"starcoder2": {"model.layers.%d", append(slices.Clone(llamaModules[:4]),
			peftModule{"mlp.c_fc", []ir.LoRATarget{ir.LoRAUp}}, peftModule{"mlp.c_proj", []ir.LoRATarget{ir.LoRADown}})},
	}
	// peftDefaults are PEFT's default targets for a family's model types,
	// as roles; a family missing here has none.
	peftDefaults = map[string][]ir.LoRATarget{
		"llama": {ir.LoRAQ, ir.LoRAV}, "gemma": {ir.LoRAQ, ir.LoRAV}, "gemma2": {ir.LoRAQ, ir.LoRAV},
		"qwen3": {ir.LoRAQ, ir.LoRAV}, "gpt2": {ir.LoRAQ, ir.LoRAK, ir.LoRAV},
	}
)

// DefaultLoRATargets returns the roles LoRA adapts in a model of family
// when none are named: PEFT's default for it (peft says so), or every
// attention projection where PEFT has none.
func DefaultLoRATargets(family string) (targets []ir.LoRATarget, peft bool) {
	if t, ok := peftDefaults[family]; ok {
		return slices.Clone(t), true
	}
	return []ir.LoRATarget{ir.LoRAQ, ir.LoRAK, ir.LoRAV, ir.LoRAO}, false
}

// moduleNames lists the family's PEFT module names, for errors.
func moduleNames(family string) string {
	var names []string
	for _, m := range familyModules[family].modules {
		name := m.path[strings.LastIndexByte(m.path, '.')+1:]
		if !slices.Contains(names, name) {
			names = append(names, name)
		}
	}
	return strings.Join(names, ", ")
}

// targetRule picks modules by their full names, as one entry of PEFT's
// target_modules (or exclude_modules) does.
type targetRule struct {
	name    string         // the entry as written
	pattern *regexp.Regexp // a string target_modules; nil for a list entry
}

func (r targetRule) matches(key string) bool {
	switch {
	case r.pattern != nil:
		return r.pattern.MatchString(key)
	case r.name == "all-linear":
		return true
	}
	return key == r.name || strings.HasSuffix(key, "."+r.name)
}

// patternRule compiles a string target_modules, which PEFT matches with
// Python's re.fullmatch, as a regular expression the whole name matches.
func patternRule(s string) (targetRule, error) {
	re, err := regexp.Compile(`^(?:` + s + `)$`)
	if err != nil {
		return targetRule{}, fmt.Errorf("the pattern %q is not a regular expression ckptplan reads (RE2 syntax: %v)", s, err)
	}
	return targetRule{name: s, pattern: re}, nil
}

// resolveTargets returns the roles the rules adapt in every one of the
// model's decoder layers, less those the exclusions name.
func resolveTargets(m *Model, rules, exclude []targetRule) ([]ir.LoRATarget, error) {
	fam, ok := familyModules[m.Family]
	if !ok {
		return nil, fmt.Errorf("ckptplan knows no PEFT module names of the %s family", m.Family)
	}
	var first []ir.LoRATarget
	used := make([]bool, len(rules))
	for l := range m.Layers {
		var roles []ir.LoRATarget
		for _, mod := range fam.modules {
			key := fmt.Sprintf(fam.layer, l) + "." + mod.path
			hit := false
			for i, r := range rules {
				if r.matches(key) {
					hit, used[i] = true, true
				}
			}
			if !hit || slices.ContainsFunc(exclude, func(r targetRule) bool { return r.matches(key) }) {
				continue
			}
			for _, role := range mod.roles {
				if !slices.Contains(roles, role) {
					roles = append(roles, role)
				}
			}
		}
		if l == 0 {
			first = roles
		} else if !slices.Equal(roles, first) {
			return nil, fmt.Errorf("adapts %s in layer 0 but %s in layer %d: ckptplan plans LoRA alike in every layer", roleList(first), roleList(roles), l)
		}
	}
	for i, r := range rules {
		if !used[i] {
			return nil, fmt.Errorf("%q names no linear of a %s decoder layer (%s): ckptplan plans LoRA on those", r.name, m.Family, moduleNames(m.Family))
		}
	}
	if len(first) == 0 {
		return nil, fmt.Errorf("adapts no linear of a %s decoder layer", m.Family)
	}
	return first, nil
}

func roleList(roles []ir.LoRATarget) string {
	if len(roles) == 0 {
		return "nothing"
	}
	s := make([]string, len(roles))
	for i, r := range roles {
		s[i] = string(r)
	}
	return strings.Join(s, ",")
}

// LoRATargetsNamed resolves the names of --lora-targets for m: ckptplan's
// roles (q, k, v, o, gate, up, down), PEFT's module names for the family
// ("q_proj", GPT-2's "c_attn"), or "all-linear".
func LoRATargetsNamed(m *Model, names []string) ([]ir.LoRATarget, error) {
	var out []ir.LoRATarget
	var rules []targetRule
	for _, n := range names {
		n = strings.TrimSpace(n)
		switch {
		case n == "":
			return nil, fmt.Errorf("an empty name")
		case slices.Contains(ir.LoRATargets(), ir.LoRATarget(n)):
			if !slices.Contains(out, ir.LoRATarget(n)) {
				out = append(out, ir.LoRATarget(n))
			}
		default:
			rules = append(rules, targetRule{name: n})
		}
	}
	if len(rules) > 0 {
		roles, err := resolveTargets(m, rules, nil)
		if err != nil {
			return nil, err
		}
		for _, r := range roles {
			if !slices.Contains(out, r) {
				out = append(out, r)
			}
		}
	}
	return out, nil
}

// ApplyPEFTAdapter sets m's LoRA from a PEFT adapter_config.json (file
// names it in errors): rank, targets and dropout; fp32 adapters over
// 16-bit weights, as PEFT makes them.
func ApplyPEFTAdapter(m *Model, file string, data []byte) error {
	root, err := parseJSON(file, data)
	if err != nil {
		return err
	}
	d := newDecoder(file)
	if root.Kind != yaml.MappingNode {
		return d.errAt(root, "want a JSON object (a PEFT adapter_config.json), got %s", jsonKind(root))
	}
	if err := CheckJSONKeys(file, data); err != nil {
		return err
	}
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(data, &raw); err != nil {
		return &PosError{File: file, Msg: err.Error()}
	}
	at := func(key string) *yaml.Node {
		for i := 0; i+1 < len(root.Content); i += 2 {
			if root.Content[i].Value == key {
				return root.Content[i+1]
			}
		}
		return root
	}
	// get decodes key into v; a key that is absent or null leaves v.
	get := func(key string, v any, want string) (bool, error) {
		b, ok := raw[key]
		if !ok || string(b) == "null" {
			return false, nil
		}
		if err := json.Unmarshal(b, v); err != nil {
			return false, d.errAt(at(key), "%s: want %s, got %s", key, want, jsonKind(at(key)))
		}
		return true, nil
	}
	var peftType string
	if _, err := get("peft_type", &peftType, "a string"); err != nil {
		return err
	}
	if peftType != "LORA" {
		if peftType == "" {
			return d.errAt(root, "no peft_type: not a PEFT adapter_config.json")
		}
		return d.errAt(at("peft_type"), "peft_type %q: ckptplan plans LoRA adapters", peftType)
	}
	lora := ir.LoRA{Rank: 8, FP32: true, Alpha: ir.DefaultLoRAAlpha} // LoraConfig's r and lora_alpha
	if _, err := get("r", &lora.Rank, "a whole number"); err != nil {
		return err
	}
	if lora.Rank <= 0 {
		return d.errAt(at("r"), "r: the adapters' rank must be positive, got %d", lora.Rank)
	}
	if _, err := get("lora_alpha", &lora.Alpha, "a number"); err != nil {
		return err
	}
	if _, err := get("lora_dropout", &lora.Dropout, "a number"); err != nil {
		return err
	}
	if lora.Dropout < 0 || lora.Dropout >= 1 {
		return d.errAt(at("lora_dropout"), "lora_dropout: must be in [0, 1), got %v", lora.Dropout)
	}
	var flag bool
	for _, k := range []struct{ key, why string }{
		{"use_dora", "DoRA trains a magnitude per output and keeps the adapted weight's norm: ckptplan plans LoRA"},
		{"lora_bias", "a trained bias on each adapter's B: ckptplan plans LoRA without one"},
	} {
		if ok, err := get(k.key, &flag, "true or false"); err != nil {
			return err
		} else if ok && flag {
			return d.errAt(at(k.key), "%s: %s", k.key, k.why)
		}
	}
	var bias string
	if ok, err := get("bias", &bias, "a string"); err != nil {
		return err
	} else if ok && bias != "none" {
		return d.errAt(at("bias"), "bias %q trains the model's biases besides the adapters: ckptplan plans LoRA with bias \"none\"", bias)
	}
	var pattern map[string]json.RawMessage
	if ok, err := get("rank_pattern", &pattern, "an object"); err != nil {
		return err
	} else if ok && len(pattern) > 0 {
		return d.errAt(at("rank_pattern"), "rank_pattern gives some modules a rank of their own: ckptplan plans one rank")
	}
	var names []string
	for _, key := range []string{"modules_to_save", "target_parameters"} {
		if ok, err := get(key, &names, "a list of names"); err != nil {
			return err
		} else if ok && len(names) > 0 {
			return d.errAt(at(key), "%s %q trains more than the adapters: ckptplan plans LoRA on the decoder layers' linears", key, names)
		}
	}
	for _, k := range []struct{ key, why string }{
		{"layers_to_transform", "adapts some layers only: ckptplan plans LoRA alike in every layer"},
		{"layer_replication", "repeats layers of the base model: ckptplan plans the model's own layers"},
		{"trainable_token_indices", "trains rows of the embeddings besides the adapters: ckptplan plans LoRA on the decoder layers' linears"},
		{"alora_invocation_tokens", "adapts only the tokens after an invocation (activated LoRA): ckptplan plans LoRA over every token"},
	} {
		var v any
		if ok, _ := get(k.key, &v, ""); ok && v != false && !isEmpty(v) {
			return d.errAt(at(k.key), "%s %s", k.key, k.why)
		}
	}
	for _, key := range []string{"use_qalora", "use_bdlora"} {
		var v any
		if ok, _ := get(key, &v, ""); ok && v != false && !isEmpty(v) {
			return d.errAt(at(key), "%s: a variant of LoRA ckptplan does not plan", key)
		}
	}
	rulesOf := func(key string) ([]targetRule, error) {
		var s string
		if ok, _ := get(key, &s, ""); ok {
			if s == "all-linear" {
				return []targetRule{{name: s}}, nil
			}
			r, err := patternRule(s)
			if err != nil {
				return nil, d.errAt(at(key), "%s: %v", key, err)
			}
			return []targetRule{r}, nil
		}
		var list []string
		if _, err := get(key, &list, "a list of module names or a regular expression"); err != nil {
			return nil, err
		}
		var rules []targetRule
		for _, n := range list {
			rules = append(rules, targetRule{name: n})
		}
		return rules, nil
	}
	rules, err := rulesOf("target_modules")
	if err != nil {
		return err
	}
	exclude, err := rulesOf("exclude_modules")
	if err != nil {
		return err
	}
	if len(rules) == 0 {
		t, ok := DefaultLoRATargets(m.Family)
		if !ok {
			return d.errAt(at("target_modules"), "target_modules: none, and PEFT has no default for the %s family: name them (%s)", m.Family, moduleNames(m.Family))
		}
		lora.Targets = t
	} else if lora.Targets, err = resolveTargets(m, rules, exclude); err != nil {
		return d.errAt(at("target_modules"), "target_modules: %v", err)
	}
	m.Training.LoRA = lora
	return nil
}

// isEmpty reports whether a decoded JSON value is an empty list or object.
func isEmpty(v any) bool {
	switch v := v.(type) {
	case []any:
		return len(v) == 0
	case map[string]any:
		return len(v) == 0
	}
	return false
}
