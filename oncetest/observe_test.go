package oncetest

import (
	"fmt"
	"testing"
)

// TestCompareEffects: the comparison behind a report's hint, on the shapes Config.Effect
// returns in practice.
func TestCompareEffects(t *testing.T) {
	for _, c := range []struct {
		got, want any
		d         difference
	}{
		{3, 3, same},
		{int64(4), int64(3), more},
		{2, 3, less},
		{2.5, 3.0, less},
		{[]string{"a: balance 9, 4 ledger rows", "b: balance 8, 1 ledger rows"}, []string{"a: balance 7, 3 ledger rows", "b: balance 8, 1 ledger rows"}, more},
		{[]string{"a: balance 4, 3 ledger rows", "b: balance 8, 1 ledger rows"}, []string{"a: balance 7, 3 ledger rows", "b: balance 8, 1 ledger rows"}, less},
		{[]string{"a: balance 9, 2 ledger rows"}, []string{"a: balance 7, 3 ledger rows"}, different},
		{"pay-1=200, pay-1=200, pay-2=500", "pay-1=200, pay-2=500", more},
		{"pay-2=500", "pay-1=200, pay-2=500", less},
		{"pay-1=300, pay-2=500", "pay-1=200, pay-2=500", more},
		{"order 7: REFUNDED", "order 7: PAID", different},
		{"", "pay-1=200", less},
		{map[string]int{"a": 2, "b": 1}, map[string]int{"a": 1, "b": 1}, more},
		{map[string]int{"a": 1}, map[string]int{"a": 1, "b": 1}, less},
		{struct{ N, M int }{1, 5}, struct{ N, M int }{2, 5}, less},
		{"balance -5", "balance -3", less},
		{int32(3), int64(3), different},
		{fmt.Sprint(3), 3, different},
	} {
		if d := compareEffects(c.got, c.want); d != c.d {
			t.Errorf("compareEffects(%#v, %#v) = %s, want %s", c.got, c.want, d, c.d)
		}
	}
}
