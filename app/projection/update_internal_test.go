package projection

import "testing"

// TestNewUpdateKeepsItsFirstOpsInline: the ops of an update of up to three (every shipped
// projection's) are kept in the Update's own allocation, not grown from nil op by op.
func TestNewUpdateKeepsItsFirstOpsInline(t *testing.T) {
	u := NewUpdate("location:7").
		HIncrBy("stats", "numCheckins", 1).
		HIncrBy("stats", "numStars", 4).
		HRound("stats", "averageStars", "numStars", "numCheckins")
	if len(u.Ops) != 3 || &u.Ops[0] != &u.first[0] {
		t.Fatalf("the first three ops were moved out of the Update (len %d, cap %d)", len(u.Ops), cap(u.Ops))
	}
	u.ZAdd("recent", 1, "m")
	if len(u.Ops) != 4 || u.Ops[3].Kind != OpZAdd || u.Ops[0].Kind != OpHIncrBy || u.Ops[2].Kind != OpHRound {
		t.Fatalf("a fourth op: got %+v", u.Ops)
	}
}
