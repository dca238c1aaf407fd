// Package models holds the bundled model descriptions, embedded in the
// binary so that a model can be named from any directory without a network.
package models
