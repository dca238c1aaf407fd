package exec

import "testing"

func TestTracker(t *testing.T) {
	tr := NewTracker()
	a := tr.Alloc(10, 40, "a")
	tr.Begin("op")
	b := tr.Alloc(5, 20, "b")
	ids := tr.AllocIDs(3, "ids")
	tr.Free(b)
	tr.End()
	if tr.Live() != 40+24 || tr.Peak() != 40+20+24 || tr.Buffers() != 2 {
		t.Errorf("live %d peak %d buffers %d", tr.Live(), tr.Peak(), tr.Buffers())
	}
	if s := tr.Timeline[0]; s.Label != "op" || s.Peak != 84 || s.After != 64 {
		t.Errorf("timeline %+v", s)
	}
	tr.Free(a)
	tr.Free(ids)
	defer func() {
		if recover() == nil {
			t.Error("double free did not panic")
		}
	}()
	tr.Free(a)
}
