package oncetest

import (
	"cmp"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"unicode"
)

// difference is how an observed effect differs from the reference's. The hint of a report is
// chosen by it, not by the fault's name: one fault can show several bugs, and one bug shows
// under several faults.
type difference int

const (
	same      difference = iota
	more                 // more than the reference: something was applied twice
	less                 // less than the reference: something was lost
	different            // neither more nor less: other values, or other entries
)

func (d difference) String() string {
	return [...]string{"the same as", "more than", "less than", "different from"}[d]
}

// compareEffects says how got differs from want. Numbers compare as numbers; lists, maps and
// text made of items ("a=1, b=2", a slice of rows) compare as multisets of items (extra items:
// more, missing items: less); values of the same shape compare number by number (every number
// at least the reference's and one above it: more; the reverse: less).
func compareEffects(got, want any) difference {
	if reflect.DeepEqual(got, want) {
		return same
	}
	if d, ok := compareAsNumbers(got, want); ok {
		return d
	}
	if d, ok := compareAsItems(got, want); ok {
		return d
	}
	if d := compareNumbers(fmt.Sprint(got), fmt.Sprint(want)); d != same {
		return d
	}
	return different // not DeepEqual, though it prints the same (another type, say)
}

// byOrder is the difference of two numbers by cmp.Compare(got, want). Equal numbers of
// different types are not what the reference gave: different.
var byOrder = map[int]difference{1: more, -1: less, 0: different}

// compareAsNumbers compares got and want when both are numbers (ok false otherwise).
func compareAsNumbers(got, want any) (d difference, ok bool) {
	g, gok := number(got)
	w, wok := number(want)
	if !gok || !wok {
		return same, false
	}
	return byOrder[cmp.Compare(g, w)], true
}

// compareAsItems compares got and want as multisets of items when both are made of items and
// their counts differ (ok false otherwise, and when neither holds the other).
func compareAsItems(got, want any) (d difference, ok bool) {
	gi, gok := items(got)
	wi, wok := items(want)
	if !gok || !wok || len(gi) == len(wi) {
		return same, false
	}
	d = compareMultisets(gi, wi)
	return d, d != different
}

func number(v any) (float64, bool) {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		return float64(rv.Int()), true
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64, reflect.Uintptr:
		return float64(rv.Uint()), true
	case reflect.Float32, reflect.Float64:
		return rv.Float(), true
	}
	return 0, false
}

// items lists the entries of a slice, an array or a map (key=value), or the items of a text
// separated by commas, semicolons or line breaks.
func items(v any) ([]string, bool) {
	rv := reflect.ValueOf(v)
	switch rv.Kind() {
	case reflect.Slice, reflect.Array:
		return elements(rv), true
	case reflect.Map:
		return entries(rv), true
	case reflect.String:
		return textItems(rv.String()), true
	}
	return nil, false
}

// elements prints each element of a slice or an array.
func elements(rv reflect.Value) []string {
	out := make([]string, rv.Len())
	for i := range out {
		out[i] = fmt.Sprint(rv.Index(i).Interface())
	}
	return out
}

// entries prints each entry of a map as key=value.
func entries(rv reflect.Value) []string {
	var out []string
	iter := rv.MapRange()
	for iter.Next() {
		out = append(out, fmt.Sprintf("%v=%v", iter.Key().Interface(), iter.Value().Interface()))
	}
	return out
}

// textItems splits a text at commas, semicolons and line breaks.
func textItems(s string) []string {
	s = strings.TrimSpace(s)
	if s == "" {
		return nil
	}
	parts := strings.FieldsFunc(s, func(r rune) bool { return strings.ContainsRune(",;\n", r) })
	for i := range parts {
		parts[i] = strings.TrimSpace(parts[i])
	}
	return parts
}

// byDirection is the difference of a comparison by whether it found values above the
// reference's and values below it: {above, below}.
var byDirection = map[[2]bool]difference{
	{false, false}: same,
	{true, false}:  more,
	{false, true}:  less,
	{true, true}:   different,
}

// compareMultisets: got holds every item of want and more (more), or want holds every item of
// got and more (less); otherwise different.
func compareMultisets(got, want []string) difference {
	count := map[string]int{}
	for _, w := range want {
		count[w]++
	}
	for _, g := range got {
		count[g]--
	}
	diffs := make([]float64, 0, len(count))
	for _, n := range count {
		diffs = append(diffs, float64(-n)) // got's count minus want's
	}
	if d := byDirection[signs(diffs)]; d != same {
		return d
	}
	return different
}

// signs says whether any of diffs (got minus want) is above zero, and whether any is below:
// the key of byDirection.
func signs(diffs []float64) [2]bool {
	var s [2]bool
	for _, d := range diffs {
		s[0] = s[0] || d > 0
		s[1] = s[1] || d < 0
	}
	return s
}

// compareNumbers compares two texts of the same shape (the same words around the numbers)
// number by number.
func compareNumbers(got, want string) difference {
	gs, gn := splitNumbers(got)
	ws, wn := splitNumbers(want)
	if gs != ws || len(gn) != len(wn) {
		return different
	}
	diffs := make([]float64, len(gn))
	for i := range gn {
		diffs[i] = gn[i] - wn[i]
	}
	return byDirection[signs(diffs)]
}

// splitNumbers returns s with every number replaced by '#', and the numbers.
func splitNumbers(s string) (string, []float64) {
	var shape strings.Builder
	var nums []float64
	rs := []rune(s)
	for i := 0; i < len(rs); {
		if end, ok := numberAt(rs, i); ok {
			if v, err := strconv.ParseFloat(string(rs[i:end]), 64); err == nil {
				shape.WriteByte('#')
				nums = append(nums, v)
				i = end
				continue
			}
		}
		shape.WriteRune(rs[i])
		i++
	}
	return shape.String(), nums
}

// numberAt returns where the number that starts at rs[i] ends: digits, a '.' between digits,
// and a leading minus sign only where no word precedes it ("pay-1" is an id). ok is false when
// no number starts there.
func numberAt(rs []rune, i int) (end int, ok bool) {
	j := i
	if rs[j] == '-' && !wordBefore(rs, i) {
		j++
	}
	if !digitAt(rs, j) {
		return i, false
	}
	for digitAt(rs, j) || digitAt(rs, j+1) && rs[j] == '.' {
		j++
	}
	return j, true
}

// wordBefore reports whether a word character precedes rs[i].
func wordBefore(rs []rune, i int) bool { return i > 0 && isWord(rs[i-1]) }

// digitAt reports whether rs has a digit at i.
func digitAt(rs []rune, i int) bool { return i < len(rs) && unicode.IsDigit(rs[i]) }

func isWord(r rune) bool { return unicode.IsLetter(r) || unicode.IsDigit(r) || r == '_' || r == '-' }

// effectHints is what an effect that differs from the reference in each way usually means in
// handler code; faultHints adds what the fault did to show it.
var effectHints = map[difference]string{
	more:      "the effect was applied more than once: part of an attempt that did not count survived it. The handler writes through the pool (or a connection of its own) instead of the transaction it was lent (pgtx.TxFromContext), or changes memory or an outside system that the rollback of an attempt does not undo; write through the lent transaction, or make an outside effect idempotent under a key derived from the event (effects/idemkey)",
	less:      "part of the effect is missing: a lost update or a skipped event. A handler that reads a value and writes back one computed from it loses an update when another delivery changes the row in between: at READ COMMITTED (the inbox Processor's default) the later write overwrites the earlier, and a read through the pool or a cache misses what the lent transaction wrote; read through the lent transaction and write relative updates (SET n = n + $1), lock the row first (SELECT ... FOR UPDATE), or run at REPEATABLE READ (once.Config.TxOptions, inbox.ProcessorConfig.TxOptions). A handler that remembers outside the transaction what it did (a set in memory, a flag committed apart from the lent transaction) skips the retry of an attempt that was rolled back",
	different: "the effect depends on something other than the events: the order in which concurrent deliveries ran (or their order in a shared group-commit transaction), the clock, randomness, or state read outside the lent transaction; derive it from the event and rows read through the transaction (pgtx.TxFromContext)",
}

const (
	skippedCopyHint = "; here a copy that the claim skips before the handler runs added to it, so the extra work happened outside the claim"
	rolledBackHint  = "; here an attempt that was rolled back and run again left it behind"
	// reorderHint replaces the hint of a different effect under FaultReorder.
	reorderHint = "the effect depends on arrival order (the events arrived out of their producer's order, as brokers redeliver): store a version per entity and refuse stale events (effects/versioned), or make the effect commutative"
)

var faultHints = map[difference]map[Fault]string{
	more: {
		FaultSequentialCopies: skippedCopyHint, FaultConcurrentCopies: skippedCopyHint,
		FaultTransient: rolledBackHint, FaultKillMidHandler: rolledBackHint, FaultKillDuringCommit: rolledBackHint,
		FaultShutdown: rolledBackHint, FaultFailingNeighbours: rolledBackHint,
	},
	less: {
		FaultReorder: "; here the events arrived out of order, so a handler that drops an event it takes for stale loses it: make it wait for the missing one (effects/versioned ApplyDelta returns a retryable gap error)",
	},
}

// effectHint is what an effect that differs from the reference in this way usually means in
// handler code, with what the fault did to show it.
func effectHint(d difference, f Fault) string {
	if d == different && f == FaultReorder {
		return reorderHint
	}
	return effectHints[d] + faultHints[d][f]
}
