package worker

import "hash/fnv"

// LockKey returns the PostgreSQL advisory-lock key of kind ("migrate", "relay", "retention",
// ...) for parts (a schema, then a name): the 64-bit FNV-1a hash of
// "watermill-once/<kind>/<part>/<part>...". Every advisory-lock key of the module is derived
// here, so that two places that must lock the same thing cannot drift apart.
//
// The joined text is unambiguous as long as only the last part may contain "/": kinds are
// constants and schemas are validated identifiers. The keys are those the module has always
// used, so instances of an older version exclude the new ones as before.
func LockKey(kind string, parts ...string) int64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte("watermill-once/" + kind))
	for _, p := range parts {
		_, _ = h.Write([]byte("/" + p))
	}
	return int64(h.Sum64())
}

// LockKeyParts splits a bigint advisory-lock key as pg_locks shows it: classid holds the high
// 32 bits, objid the low 32 bits (objsubid is 1).
func LockKeyParts(key int64) (classid, objid int64) {
	u := uint64(key)
	return int64(u >> 32), int64(u & 0xffffffff)
}
