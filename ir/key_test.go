package ir

import (
	"math"
	"reflect"
	"testing"
)

// TestAttrsKeyCoversEveryField sets each field of Attrs in turn, found by
// reflection, so a field added to Attrs and not to AppendKey fails here:
// its key would be the zero value's.
func TestAttrsKeyCoversEveryField(t *testing.T) {
	keys := map[string]string{string((&Attrs{}).AppendKey(nil)): "zero"}
	add := func(what string, a *Attrs) {
		t.Helper()
		k := string(a.AppendKey(nil))
		if prev, ok := keys[k]; ok {
			t.Errorf("%s has the key of %s: %q", what, prev, k)
		}
		keys[k] = what
	}
	typ := reflect.TypeOf(Attrs{})
	for i := 0; i < typ.NumField(); i++ {
		f := typ.Field(i)
		for j, v := range nonZero(t, f.Type) {
			var a Attrs
			reflect.ValueOf(&a).Elem().Field(i).Set(v)
			add(f.Name+"#"+string(rune('0'+j)), &a)
		}
	}
}

// nonZero returns distinct non-zero values of type typ, for the kinds
// Attrs holds. An empty slice is nil's equal, as it is to every rule.
func nonZero(t *testing.T, typ reflect.Type) []reflect.Value {
	conv := func(vs ...any) []reflect.Value {
		var out []reflect.Value
		for _, v := range vs {
			out = append(out, reflect.ValueOf(v).Convert(typ))
		}
		return out
	}
	switch typ {
	case reflect.TypeOf(Shape(nil)):
		return conv(Shape{1}, Shape{1, 2}, Shape{12}, Shape{-1})
	case reflect.TypeOf(Tensor{}):
		return conv(Tensor{DType: FP32}, Tensor{Shape: Shape{3}}, Tensor{Shape: Shape{3}, DType: BF16})
	case reflect.TypeOf([]Tensor(nil)):
		return conv([]Tensor{{}}, []Tensor{{Shape: Shape{2}}}, []Tensor{{}, {}})
	case reflect.TypeOf([]SaveRef(nil)):
		return conv([]SaveRef{{}}, []SaveRef{{Output: true}}, []SaveRef{{In: 1}}, []SaveRef{{}, {}})
	}
	switch typ.Kind() {
	case reflect.Bool:
		return conv(true)
	case reflect.Int, reflect.Int64, reflect.Uint8:
		return conv(1, 2, 35, 36)
	case reflect.Float64:
		return conv(0.5, math.Copysign(0, -1), 1e-6)
	case reflect.String:
		return conv("a", " ", `"`, "a,b")
	}
	t.Fatalf("no values for %v: teach nonZero this type", typ)
	return nil
}
