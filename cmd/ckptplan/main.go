package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
)

func main() {
	// A panic is a bug in ckptplan; say so in one line rather than with a
	// stack trace.
	defer func() {
		if r := recover(); r != nil {
			msg := fmt.Sprintf("internal error: %v (please report it with the command that caused it)", r)
			fmt.Fprintf(os.Stderr, "ckptplan: %s\n", msg)
			if os.Getenv(errorsEnv) == "json" {
				writeErrorReport(os.Stderr, errorReport{Kind: "internal", Message: msg})
			}
			os.Exit(1)
		}
	}()
	stdout, stderr := &textOnly{w: os.Stdout}, &textOnly{w: os.Stderr}
	err := run(stdout, stderr, os.Args[1:])
	if err == nil {
		return
	}
	if !errors.Is(err, errUsageShown) {
		fmt.Fprintf(stderr, "ckptplan: %v\n", err)
	}
	if os.Getenv(errorsEnv) == "json" {
		writeErrorReport(stderr, reportOf(err))
	}
	var u *usageError
	if errors.As(err, &u) || errors.Is(err, errUsageShown) {
		os.Exit(2)
	}
	os.Exit(1)
}

// usageError is a mistake on the command line: exit status 2.
type usageError struct{ msg string }

func (e *usageError) Error() string { return e.msg }

// errUsageShown reports that flag parsing already printed the problem and
// the usage; nothing more is printed and the status is 2.
var errUsageShown = errors.New("usage")

func usagef(format string, args ...any) error {
	return &usageError{fmt.Sprintf(format, args...)}
}

type command struct {
	name  string
	args  string
	short string
	run   func(stdout, stderr io.Writer, args []string) error
}

func commands() []command {
	return []command{
		{"models", "", "list the bundled models", runModels},
		{"inspect", "MODEL", "show a model's graph: layers, ops, parameters, largest tensors", runInspect},
		{"cost", "MODEL", "activation bytes kept for backward and FLOPs, per block; static memory", runCost},
		{"plan", "MODEL", "the checkpointing schedule that fits a budget with the least recompute", runPlan},
		{"compare", "MODEL", "every strategy side by side at one budget", runCompare},
		{"fit", "MODEL", "the largest batch and sequence a GPU fits, and the settings that reach a global batch", runFit},
		{"run", "MODEL", "run a plan on the CPU and check its memory and gradients", runRun},
		{"sweep", "MODEL", "memory against recomputation for every budget and strategy", runSweep},
		{"export", "MODEL", "a plan for PyTorch (a Python module), Hugging Face or Megatron-LM", runExport},
		{"trace", "CONFIG", "a graph of any model transformers builds (in the Python package)", runTrace},
	}
}

// runTrace says where trace runs: it builds the model with transformers,
// which only the Python package has.
func runTrace(stdout, stderr io.Writer, args []string) error {
	return fmt.Errorf("trace runs in the Python package, which builds the model with transformers: " +
		"'pip install ./python' from a clone of ckptplan (or its wheel), then 'ckptplan trace CONFIG -o graph.yaml' (or 'python -m ckptplan trace ...'), then 'ckptplan plan graph.yaml'")
}

func usage(w io.Writer) {
	fmt.Fprintf(w, "usage: ckptplan COMMAND [flags] [args]\n\ncommands:\n")
	for _, c := range commands() {
		fmt.Fprintf(w, "  %-8s %-7s %s\n", c.name, c.args, c.short)
	}
	fmt.Fprintf(w, "\nMODEL is a bundled model name, a model/graph/chain YAML file or a Hugging Face config.json.\nRun 'ckptplan COMMAND -h' for a command's flags.\n")
}

// run executes one ckptplan command; main is a thin shell around it so that
// tests can run commands in process.
func run(stdout, stderr io.Writer, args []string) error {
	if len(args) == 0 {
		usage(stderr)
		return errUsageShown
	}
	name := args[0]
	if name == "help" || name == "-h" || name == "--help" || name == "-help" {
		usage(stdout)
		return nil
	}
	for _, c := range commands() {
		if c.name == name {
			err := c.run(stdout, stderr, args[1:])
			if errors.Is(err, errHelp) {
				return nil
			}
			return err
		}
	}
	usage(stderr)
	return usagef("unknown command %q", strings.TrimSpace(name))
}
