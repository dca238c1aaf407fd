// Package mem is ckptplan's unit of memory: Bytes, a byte count that
// prints with binary units and parses the units people write ("24GiB",
// "512 MiB", "1.5GB"). Every budget, peak and size the planner and the
// solver pass around is a Bytes, from the command-line flag to the
// solver's table, which alone converts it to slots.
package mem
