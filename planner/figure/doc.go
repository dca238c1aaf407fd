// Package figure draws ckptplan's pictures with gonum/plot: the
// memory/compute trade-off of a sweep, and memory over a schedule.
package figure
