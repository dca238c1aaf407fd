// Package graphio reads what users describe models with and turns it into
// ir graphs: a model YAML (a family with its sizes and a training setup),
// a Hugging Face config.json, an explicit graph YAML (nodes, ops, shapes
// and repeat blocks), or a profiled chain YAML (measured per-stage costs,
// handed to the solver as they are). Load tells them apart by name or by
// their top-level key; bundled models are read from package models.
//
// Every error in an input names the file, line and column of the value
// at fault (*PosError): syntax, unknown or duplicate keys, wrong types,
// and the rules that make a description meaningful. Input size, aliases
// and graph sizes are bounded before anything large is allocated.
package graphio
