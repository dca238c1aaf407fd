package export

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/ckptplan/ckptplan/planner"
)

// hostile are names a model YAML or a plan JSON may carry, each trying to
// leave a comment or a string of the generated code and run something:
// the marker file they would create must not appear.
func hostile(marker string) []string {
	run := `open(` + strconvQuote(marker) + `, "w")`
	return []string{
		"x\n" + run + "\n#",
		"x\r" + run + "\r#",
		"x'''); " + run + "; ('''",
		`x""")); ` + run + `; (("""`,
		"x\\'''\n" + run,
		"x\u2028" + run,
		"x\x1b[2J\x1b]0;pwned\x07",
		"x\\",
		// An encoding declaration on line 1 or 2 would turn the escapes
		// below back into quotes and newlines.
		"x coding:raw_unicode_escape ''' + str(" + run + ") + r'''",
		"x coding:unicode_escape\n" + run,
	}
}

func strconvQuote(s string) string { b, _ := json.Marshal(s); return string(b) }

func hostileExport(names []string) *Export {
	e := &Export{Schema: 1, Model: strings.Join(names, " "), Solver: names[2], BudgetBytes: 1 << 30, PeakBytes: 1 << 29, Overhead: 0.1}
	for i, n := range names {
		e.Layers = append(e.Layers, Layer{Name: n, Mode: "selective", Policy: n, KeptBytes: 1024,
			Saved: []planner.SavedTensor{{Name: n, Bytes: 512, Keep: true}, {Name: n + "'", Bytes: 512}}})
		if i%2 == 0 {
			e.Layers[i].Mode, e.Layers[i].Policy, e.Layers[i].Saved = "checkpoint", "", nil
		}
	}
	e.Notes = names
	e.nothing = make([]bool, len(e.Layers))
	return e
}

// TestHostileNamesStayText writes every export from names built to break
// out of comments and strings, then, with Python, imports the PyTorch
// module (against a stand-in torch, so that nothing but the module runs)
// and runs the Hugging Face calls on a stand-in model: the plan reads back
// with every name intact and no marker file appears. The Megatron flags
// are checked line by line.
func TestHostileNamesStayText(t *testing.T) {
	dir := t.TempDir()
	marker := filepath.Join(dir, "PWNED")
	names := hostile(marker)
	e := hostileExport(names)

	var py, hf, mg bytes.Buffer
	if err := e.PyTorch(&py, strings.Join(names, " ")); err != nil {
		t.Fatal(err)
	}
	if err := e.HF(&hf, nil); err != nil {
		t.Fatal(err)
	}
	if err := e.Megatron(&mg, nil, planner.MegatronRecompute{}); err == nil {
		flags := regexp.MustCompile(`^--[-a-z0-9 ]+$`)
		for _, line := range strings.Split(strings.TrimSuffix(mg.String(), "\n"), "\n") {
			if !strings.HasPrefix(line, "# ") && !flags.MatchString(line) {
				t.Errorf("megatron line %q is neither a comment nor flags", line)
			}
		}
	}
	for name, text := range map[string]string{"pytorch": py.String(), "hf": hf.String(), "megatron": mg.String()} {
		if strings.ContainsAny(text, "\r\x1b\u2028") {
			t.Errorf("%s export carries a raw control character", name)
		}
	}

	python, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("SKIPPED: no python3 to import the generated module")
	}
	// A stand-in torch: the runtime imports it at module level.
	stub := filepath.Join(dir, "torch")
	os.MkdirAll(filepath.Join(stub, "utils"), 0o755)
	os.WriteFile(filepath.Join(stub, "__init__.py"), []byte("def __getattr__(name):\n    return None\n"), 0o644)
	os.WriteFile(filepath.Join(stub, "utils", "__init__.py"), []byte(""), 0o644)
	os.WriteFile(filepath.Join(stub, "utils", "checkpoint.py"), []byte("def __getattr__(name):\n    return None\n"), 0o644)
	os.WriteFile(filepath.Join(stub, "utils", "_python_dispatch.py"), []byte("TorchDispatchMode = object\n"), 0o644)
	os.WriteFile(filepath.Join(stub, "utils", "_pytree.py"), []byte("def tree_flatten(tree):\n    return [], None\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "plan_mod.py"), py.Bytes(), 0o644)
	os.WriteFile(filepath.Join(dir, "hf_calls.py"), hf.Bytes(), 0o644)
	want, _ := json.Marshal(e)
	os.WriteFile(filepath.Join(dir, "want.json"), want, 0o644)
	check := `
import json, sys
sys.path.insert(0, sys.argv[1])
import plan_mod
want = json.load(open(sys.argv[1] + "/want.json"))
assert plan_mod.PLAN == want, (plan_mod.PLAN, want)
class Layer: pass
class Inner: layers = [Layer() for _ in range(len(want["layers"]))]
class Model:
    model = Inner()
    def gradient_checkpointing_enable(self, **kw): self.enabled = kw
model = Model()
exec(compile(open(sys.argv[1] + "/hf_calls.py").read(), "hf_calls.py", "exec"), {"model": model})
assert model.enabled == {"gradient_checkpointing_kwargs": {"use_reentrant": False}}
print("ok")
`
	out, err := exec.Command(python, "-I", "-c", check, dir).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v: %s", err, out)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Fatal("a hostile name ran code: the marker file exists")
	}
}
