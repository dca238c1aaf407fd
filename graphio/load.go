package graphio

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/ckptplan/ckptplan/models"
	"go.yaml.in/yaml/v3"
)

// Kind says what a loaded input describes.
type Kind int

// The kinds of input.
const (
	KindModel Kind = iota // a model of a known family (YAML or HF config.json)
	KindGraph             // an explicit graph
	KindChain             // a profiled chain of stages with given costs
)

func (k Kind) String() string {
	return [...]string{"model", "graph", "chain"}[k]
}

// Source is a loaded input. Exactly one of Model, Graph and Chain is set,
// as Kind says.
type Source struct {
	Name  string // the bundled name or the file path as given
	Kind  Kind
	Model *Model
	Graph *GraphSpec
	Chain *Chain
}

// maxFileSize bounds the inputs read; no real description comes near it.
const maxFileSize = 16 << 20

// Load reads a bundled model by name, or a file: a model, graph or chain
// YAML (told apart by their top-level key), or a Hugging Face config.json
// (by its .json extension). Errors carry the file and position.
func Load(arg string) (*Source, error) {
	if data, ok := models.Read(arg); ok {
		m, err := ParseModel("models/"+arg+".yaml", data)
		if err != nil {
			return nil, err
		}
		return &Source{Name: arg, Kind: KindModel, Model: m}, nil
	}
	info, err := os.Stat(arg)
	if err != nil {
		ext := strings.ToLower(filepath.Ext(arg))
		if !strings.ContainsAny(arg, "/\\") && ext != ".yaml" && ext != ".yml" && ext != ".json" {
			return nil, fmt.Errorf("unknown model %q: not a bundled model (see 'ckptplan models') nor a file", arg)
		}
		return nil, fmt.Errorf("%s: no such file", arg)
	}
	if info.IsDir() {
		return nil, fmt.Errorf("%s: is a directory, want a YAML or config.json file", arg)
	}
	if info.Size() > maxFileSize {
		return nil, fmt.Errorf("%s: file is larger than %d MiB", arg, maxFileSize>>20)
	}
	data, err := os.ReadFile(arg)
	if err != nil {
		return nil, err
	}
	return Parse(arg, data)
}

// Parse reads an input file's contents; file names it in errors and its
// extension tells a config.json from YAML.
func Parse(file string, data []byte) (*Source, error) {
	if strings.EqualFold(filepath.Ext(file), ".json") {
		m, err := ParseHFConfig(file, data)
		if err != nil {
			return nil, err
		}
		return &Source{Name: file, Kind: KindModel, Model: m}, nil
	}
	if len(strings.TrimSpace(string(data))) == 0 {
		return nil, &PosError{File: file, Msg: "empty file"}
	}
	if !isText(data) {
		return nil, &PosError{File: file, Msg: "not a text file"}
	}
	root, err := parseYAML(file, data)
	if err != nil {
		return nil, err
	}
	d := newDecoder(file)
	if root.Kind == yaml.MappingNode && len(root.Content) >= 2 {
		switch root.Content[0].Value {
		case "graph":
			g, err := decodeGraphSpec(d, root)
			if err != nil {
				return nil, err
			}
			return &Source{Name: file, Kind: KindGraph, Graph: g}, nil
		case "chain":
			c, err := decodeChain(d, root)
			if err != nil {
				return nil, err
			}
			return &Source{Name: file, Kind: KindChain, Chain: c}, nil
		}
	}
	m, err := decodeModel(d, root)
	if err != nil {
		return nil, err
	}
	return &Source{Name: file, Kind: KindModel, Model: m}, nil
}

// isText reports whether data looks like text: valid UTF-8 without NULs.
func isText(data []byte) bool {
	return !strings.ContainsRune(string(data), 0) && strings.ToValidUTF8(string(data), "\uFFFD") == string(data)
}
