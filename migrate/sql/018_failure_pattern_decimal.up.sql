-- Failure groups: a decimal number is a number. Migration 015 rewrote any run of 6 or more
-- hex digits holding a digit as <hex>, so a purely decimal id of 6+ digits became <hex> while a
-- shorter one became <n>: "account 7 is frozen" and "account 100000 is frozen", one storm, made
-- two groups. Now <hex> is only what cannot be a decimal number or has a digest's shape:
--
-- failure_pattern replaces, in this order: UUIDs by <uuid>; IPv4 addresses (with a port) and
-- bracketed IPv6 addresses (with a zone and a port) by <addr>; 0x-prefixed hex, runs of exactly
-- 32, 40, 64 or 128 hex digits (MD5, SHA-1, SHA-256, SHA-512 digests, trace ids) and runs of 6 or
-- more hex digits holding both a digit and a letter a-f by <hex>; every other run of digits by
-- <n>. Words of hex letters alone (cafe, deadbeef) stay words.
--
-- Fingerprints are computed from the stored errors whenever groups are read, never stored, so no
-- row needs rewriting; a fingerprint copied before this migration may name no group after it.
CREATE OR REPLACE FUNCTION {{schema}}.failure_pattern(err text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
    coalesce(err, ''),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
    '\m[0-9]{1,3}(\.[0-9]{1,3}){3}(:[0-9]+)?', '<addr>', 'g'),
    '\[[0-9a-fA-F:.]*:[0-9a-fA-F:.]*(%[^]]*)?\](:[0-9]+)?', '<addr>', 'g'),
    '\m0[xX][0-9a-fA-F]+\M', '<hex>', 'g'),
    '\m([0-9a-fA-F]{32}|[0-9a-fA-F]{40}|[0-9a-fA-F]{64}|[0-9a-fA-F]{128})\M', '<hex>', 'g'),
    '\m(?=[0-9]*[a-fA-F])(?=[a-fA-F]*[0-9])[0-9a-fA-F]{6,}\M', '<hex>', 'g'),
    '[0-9]+', '<n>', 'g')
$$;
