package ir

import (
	"math"
	"strconv"
)

// AppendKey appends to b a key of the attributes: equal attributes give
// equal keys, and different ones different keys. Every field is written in
// declaration order, numbers in full, strings quoted and slices with their
// length, so no two attribute values share a key. A stage's signature is
// built from its nodes' keys, once a stage for every graph a search plans,
// which is why this is not fmt's %+v.
func (a *Attrs) AppendKey(b []byte) []byte {
	for _, v := range [...]int64{a.Out, a.Experts, a.TopK, a.Vocab, a.LoRARank, a.Heads, a.KVHeads,
		int64(a.Axis), int64(a.Axis2), int64(a.Parts), int64(a.Index), a.CacheLen, int64(a.ViewOf),
		a.FLOPs, a.BackwardFLOPs, a.Params, a.TrainParams, a.HostBytes,
		int64(a.To), int64(a.ParamDType)} {
		b = strconv.AppendInt(b, v, 36)
		b = append(b, ',')
	}
	for _, v := range [...]float64{a.LoRADrop, a.P, a.Factor, a.Eps, a.Theta} {
		b = strconv.AppendUint(b, math.Float64bits(v), 36)
		b = append(b, ',')
	}
	var flags uint64
	for i, v := range [...]bool{a.Bias, a.Frozen, a.Upcast, a.Safe, a.OnePlus, a.Autocast,
		a.Flash, a.BSHD, a.TanhPy, a.TensorConst, a.ScalarArg, a.Causal, a.MaskKept,
		a.TransposeB, a.Tables, a.View, a.Interleave, a.Grad, a.Buffer} {
		if v {
			flags |= 1 << i
		}
	}
	b = strconv.AppendUint(b, flags, 36)
	for _, s := range [...]string{a.Tied, a.ModelMask, a.Fn, a.HeldTo} {
		b = append(b, ' ')
		b = strconv.AppendQuote(b, s)
	}
	b = a.Sizes.appendKey(b)
	b = a.Shape.appendKey(b)
	b = a.Type.AppendKey(b)
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(a.Extras)), 10)
	for _, t := range a.Extras {
		b = t.AppendKey(b)
	}
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(a.Saves)), 10)
	for _, r := range a.Saves {
		b = append(b, ' ')
		if r.Output {
			b = append(b, 'o')
		}
		b = strconv.AppendInt(b, int64(r.In), 10)
	}
	return b
}

// appendKey appends the shape's length and sizes.
func (s Shape) appendKey(b []byte) []byte {
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(len(s)), 10)
	for _, d := range s {
		b = append(b, ':')
		b = strconv.AppendInt(b, d, 10)
	}
	return b
}

// AppendKey appends a key of the tensor: its dtype and shape.
func (t Tensor) AppendKey(b []byte) []byte {
	b = append(b, ' ')
	b = strconv.AppendInt(b, int64(t.DType), 10)
	return t.Shape.appendKey(b)
}
