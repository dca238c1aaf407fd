package main

import "testing"

// TestDeterministic: the same command gives byte-identical output.
func TestDeterministic(t *testing.T) {
	for _, args := range [][]string{
		{"inspect", "llama-3-8b", "--format", "json"},
		{"cost", "gpt2", "--format", "json"},
		{"plan", "tiny-llama", "--budget", "5MiB", "--format", "json"},
		{"compare", "mistral-7b", "--budget", "200GiB", "--lora-rank", "16", "--format", "json"},
	} {
		a, _, err := runCmd(args...)
		if err != nil {
			t.Fatal(err)
		}
		for i := 0; i < 3; i++ {
			if b, _, _ := runCmd(args...); b != a {
				t.Fatalf("%v: output differs between runs", args)
			}
		}
	}
}
