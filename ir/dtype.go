package ir

import (
	"fmt"
	"strings"
)

// DType is the element type of a tensor.
type DType uint8

// The element types. The zero value is Invalid so that a forgotten dtype is
// caught by validation rather than read as fp32.
const (
	Invalid DType = iota
	FP32
	BF16
	FP16
	FP64
	Int64
	Bool
	Int32 // the integer types below appear only in traced graphs
	Int16
	Int8
	UInt8
)

var dtypeNames = [...]string{
	Invalid: "invalid",
	FP32:    "fp32",
	BF16:    "bf16",
	FP16:    "fp16",
	FP64:    "fp64",
	Int64:   "int64",
	Bool:    "bool",
	Int32:   "int32",
	Int16:   "int16",
	Int8:    "int8",
	UInt8:   "uint8",
}

// String returns the short name used in YAML and output ("bf16").
func (d DType) String() string { return indexedName(dtypeNames[:], d, "dtype") }

// Size returns the bytes of one element; 0 for Invalid.
func (d DType) Size() int64 {
	switch d {
	case FP32:
		return 4
	case BF16, FP16:
		return 2
	case FP64, Int64:
		return 8
	case Int32:
		return 4
	case Int16:
		return 2
	case Bool, Int8, UInt8:
		return 1
	}
	return 0
}

// IsFloat reports whether d is a floating-point type.
func (d DType) IsFloat() bool { return d == FP32 || d == BF16 || d == FP16 || d == FP64 }

// ParseDType parses a dtype name. It accepts the short names and PyTorch's
// long ones ("float32", "bfloat16", "float16").
func ParseDType(s string) (DType, error) {
	switch strings.ToLower(s) {
	case "fp32", "float32", "float":
		return FP32, nil
	case "bf16", "bfloat16":
		return BF16, nil
	case "fp16", "float16", "half":
		return FP16, nil
	case "fp64", "float64":
		return FP64, nil
	case "int64", "long":
		return Int64, nil
	case "bool":
		return Bool, nil
	case "int32", "int":
		return Int32, nil
	case "int16", "short":
		return Int16, nil
	case "int8":
		return Int8, nil
	case "uint8":
		return UInt8, nil
	}
	return Invalid, fmt.Errorf("unknown dtype %q (valid: fp32, bf16, fp16, fp64, int64, int32, int16, int8, uint8, bool)", s)
}

// TrainDTypes lists the dtypes a model may train in.
var TrainDTypes = []DType{FP32, BF16, FP16}
