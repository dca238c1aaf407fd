package graphio

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"

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
	// Bundled: Name is a bundled model's. SHA256 is the hex SHA-256 of
	// the bytes the source was read from (Load), which a plan records to
	// find its model again.
	Bundled bool
	SHA256  string
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
		return &Source{Name: arg, Kind: KindModel, Model: m, Bundled: true, SHA256: digest(data)}, nil
	}
	if info, err := os.Stat(arg); err == nil && info.IsDir() {
		return loadFolder(arg)
	}
	data, err := ReadInput(arg)
	if errors.Is(err, fs.ErrNotExist) {
		ext := strings.ToLower(filepath.Ext(arg))
		if _, lerr := os.Lstat(arg); lerr != nil && !strings.ContainsAny(arg, "/\\") && ext != ".yaml" && ext != ".yml" && ext != ".json" {
			return nil, fmt.Errorf("unknown model %q: not a bundled model (see 'ckptplan models') nor a file", arg)
		}
	}
	if err != nil {
		return nil, err
	}
	src, err := Parse(arg, data)
	if err != nil {
		return nil, err
	}
	src.SHA256 = digest(data)
	return src, nil
}

// loadFolder reads a Hugging Face model folder: its config.json and,
// where PEFT saved an adapter in it, its adapter_config.json. An adapter
// folder without a config.json reads its base model's from
// base_model_name_or_path where that is a local folder; ckptplan reads
// nothing from the network.
func loadFolder(dir string) (*Source, error) {
	config := filepath.Join(dir, "config.json")
	adapterFile := filepath.Join(dir, "adapter_config.json")
	var adapter []byte
	if _, err := os.Stat(adapterFile); err == nil {
		if adapter, err = ReadInput(adapterFile); err != nil {
			return nil, err
		}
	}
	if _, err := os.Stat(config); err != nil && adapter != nil {
		base, err := adapterBase(adapterFile, adapter)
		if err != nil {
			return nil, err
		}
		config = filepath.Join(base, "config.json")
	} else if err != nil {
		return nil, fmt.Errorf("%s: a folder without config.json: give a Hugging Face model folder (one with config.json, and adapter_config.json for a PEFT adapter) or a file", dir)
	}
	data, err := ReadInput(config)
	if err != nil {
		return nil, err
	}
	m, err := ParseHFConfig(config, data)
	if err != nil {
		return nil, err
	}
	if adapter != nil {
		if err := ApplyPEFTAdapter(m, adapterFile, adapter); err != nil {
			return nil, err
		}
		if err := m.Validate(); err != nil {
			return nil, fmt.Errorf("%s: %w", adapterFile, err)
		}
		data = append(append(data, 0), adapter...)
	}
	return &Source{Name: dir, Kind: KindModel, Model: m, SHA256: digest(data)}, nil
}

// adapterBase returns the local folder an adapter_config.json names as
// its base model, or an error saying where to put the base model's
// config.json.
func adapterBase(file string, data []byte) (string, error) {
	var c struct {
		Base string `json:"base_model_name_or_path"`
	}
	if err := json.Unmarshal(data, &c); err != nil {
		_, perr := parseJSON(file, data)
		if perr != nil {
			return "", perr
		}
		return "", fmt.Errorf("%s: %v", file, err)
	}
	if c.Base != "" {
		for _, dir := range []string{c.Base, filepath.Join(filepath.Dir(file), c.Base)} {
			if _, err := os.Stat(filepath.Join(dir, "config.json")); err == nil {
				return dir, nil
			}
		}
	}
	base := "its base model"
	if c.Base != "" {
		base = fmt.Sprintf("its base model %q", c.Base)
	}
	return "", fmt.Errorf("%s: a PEFT adapter without a config.json beside it, and %s is no local folder with one: put the base model's config.json in %s (ckptplan reads nothing from the network)", file, base, filepath.Dir(file))
}

// digest is the hex SHA-256 of data.
func digest(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// ReadInput reads at most maxFileSize bytes of a file, whatever size it
// reports (/dev/zero reports none), and a named pipe without waiting for
// a writer (one with none reads as empty). Errors name the file.
func ReadInput(path string) ([]byte, error) {
	info, err := os.Stat(path)
	var pe *fs.PathError
	switch {
	case errors.As(err, &pe) && errors.Is(err, syscall.ELOOP):
		return nil, fmt.Errorf("%s: a symbolic link that leads back to itself", path)
	case errors.Is(err, fs.ErrNotExist):
		return nil, noSuchFile(path)
	case err != nil:
		return nil, fmt.Errorf("%s: %w", path, errors.Unwrap(err))
	case info.IsDir():
		return nil, fmt.Errorf("%s: is a directory, want a YAML or config.json file", path)
	}
	flag := os.O_RDONLY
	if info.Mode()&fs.ModeNamedPipe != 0 {
		flag |= syscall.O_NONBLOCK
	}
	f, err := os.OpenFile(path, flag, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, errors.Unwrap(err))
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxFileSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, errors.Unwrap(err))
	}
	if len(data) > maxFileSize {
		return nil, fmt.Errorf("%s: larger than %d MiB, the most ckptplan reads of an input", path, maxFileSize>>20)
	}
	return data, nil
}

// noSuchFile is the error for an input path that names nothing.
type noSuchFile string

func (p noSuchFile) Error() string      { return string(p) + ": no such file" }
func (noSuchFile) Is(target error) bool { return target == fs.ErrNotExist }

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

// InFile puts the input's name in front of an error that does not start
// with it already (a position error does).
func InFile(name string, err error) error {
	if err == nil || strings.HasPrefix(err.Error(), name+":") || strings.HasPrefix(err.Error(), name+" ") {
		return err
	}
	return fmt.Errorf("%s: %w", name, err)
}
