package main

import (
	"fmt"
	"io"
	"os"
)

// progress tells a person at a terminal what a slow step is doing; when
// stderr is a file or a pipe it says nothing.
func progress(stderr io.Writer, format string, args ...any) {
	f, ok := stderr.(*os.File)
	if !ok {
		return
	}
	if st, err := f.Stat(); err != nil || st.Mode()&os.ModeCharDevice == 0 {
		return
	}
	fmt.Fprintf(stderr, "ckptplan: "+format+"…\n", args...)
}
