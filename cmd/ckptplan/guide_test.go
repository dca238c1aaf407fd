package main

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// commandBlock finds a fenced block that starts with a "$ ckptplan" line.
var commandBlock = regexp.MustCompile("(?s)```\n\\$ (ckptplan [^\n]*)\n(.*?)```\n")

// TestGuide runs every command of docs/guide.md and checks that its output
// is the one printed below it; -update rewrites the guide's outputs.
func TestGuide(t *testing.T) {
	const path = "../../docs/guide.md"
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	guide := string(data)
	blocks := commandBlock.FindAllStringSubmatchIndex(guide, -1)
	if len(blocks) < 6 {
		t.Fatalf("guide has %d commands, want at least 6", len(blocks))
	}
	var out strings.Builder
	last := 0
	for _, b := range blocks {
		cmd := guide[b[2]:b[3]]
		want := guide[b[4]:b[5]]
		args := strings.Fields(cmd)[1:]
		got, _, err := runCmd(args...)
		if err != nil {
			got += "ckptplan: " + err.Error() + "\n"
		}
		if !*update && got != want {
			t.Errorf("%s:\n--- guide\n%s--- now\n%s", cmd, want, got)
		}
		out.WriteString(guide[last:b[4]])
		out.WriteString(got)
		out.WriteString("```\n")
		last = b[1]
	}
	out.WriteString(guide[last:])
	if *update {
		if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}
