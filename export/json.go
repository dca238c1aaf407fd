package export

import (
	"encoding/json"
	"io"
)

// The JSON target: the per-layer plan itself, which the Python package
// reads (schema Export.Schema).
var jsonTarget = &Target{Name: "json", Help: "the per-layer plan, for the Python package",
	Write: func(w io.Writer, e *Export, _ *Setting, _ string) ([]string, error) {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		return nil, enc.Encode(e)
	}}
