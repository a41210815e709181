package setup

import "reflect"

// IsNil reports whether v is nil or an interface holding a nil pointer (or other nil
// reference). `tx, _ := pgtx.TxFromContext(ctx)` outside a transaction yields a nil *sql.Tx;
// passed as an executor interface it is not == nil, and database/sql panics on it. Functions
// that take an executor check it with IsNil and return an error instead.
func IsNil(v any) bool {
	if v == nil {
		return true
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		return rv.IsNil()
	}
	return false
}
