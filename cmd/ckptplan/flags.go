package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"slices"
	"strings"
)

// newFlags returns a flag set that reports to stderr and does not exit.
func newFlags(name, args string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "usage: ckptplan %s %s [flags]\n\nflags:\n", name, args)
		fs.PrintDefaults()
	}
	return fs
}

// parse parses flags that may come before or after the positional
// arguments ("inspect llama-3-8b --seq 4096" and "inspect --seq 4096
// llama-3-8b" both work) and returns the positional ones.
func parse(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			if errors.Is(err, flag.ErrHelp) {
				return nil, errHelp
			}
			return nil, errUsageShown
		}
		args = fs.Args()
		if len(args) == 0 {
			return pos, nil
		}
		if args[0] == "--" {
			return append(pos, args[1:]...), nil
		}
		pos = append(pos, args[0])
		args = args[1:]
	}
}

// errHelp is returned when -h was asked for: usage was printed, exit 0.
var errHelp = errors.New("help requested")

// oneArg parses flags and requires exactly one positional argument.
func oneArg(fs *flag.FlagSet, args []string, what string) (string, error) {
	pos, err := parse(fs, args)
	if err != nil {
		return "", err
	}
	if len(pos) != 1 {
		fs.Usage()
		if len(pos) == 0 {
			return "", usagef("%s: missing %s", fs.Name(), what)
		}
		return "", usagef("%s: want one %s, got %d arguments: %s", fs.Name(), what, len(pos), strings.Join(pos, " "))
	}
	return pos[0], nil
}

// formatFlag is a --format flag restricted to a list of values.
type formatFlag struct {
	value string
	valid []string
}

func (f *formatFlag) String() string { return f.value }
func (f *formatFlag) Set(s string) error {
	if !slices.Contains(f.valid, s) {
		return fmt.Errorf("unknown format %q (valid: %s)", s, strings.Join(f.valid, ", "))
	}
	f.value = s
	return nil
}

func addFormat(fs *flag.FlagSet, valid ...string) *formatFlag {
	f := &formatFlag{value: valid[0], valid: valid}
	fs.Var(f, "format", "output format: "+strings.Join(valid, " | "))
	return f
}
