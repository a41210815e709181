-- Failure groups (ops): rows that failed for the same reason are grouped by a fingerprint of
-- where they failed (the kind of row, the consumer or relay, the topic) and of their error
-- with its volatile parts replaced, so that one poison storm is one group and not 10,000 rows.
-- The rule lives here, once, so that every package, the CLI and the admin page group alike.
--
-- failure_pattern replaces, in this order: UUIDs by <uuid>; IPv4 addresses (with a port) and
-- bracketed IPv6 addresses (with a zone and a port) by <addr>; 0x-prefixed hex and runs of 6 or more hex
-- digits holding a digit by <hex>; every other run of digits by <n>.
CREATE FUNCTION {{schema}}.failure_pattern(err text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(regexp_replace(
    coalesce(err, ''),
    '[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}', '<uuid>', 'g'),
    '\m[0-9]{1,3}(\.[0-9]{1,3}){3}(:[0-9]+)?', '<addr>', 'g'),
    '\[[0-9a-fA-F:.]*:[0-9a-fA-F:.]*(%[^]]*)?\](:[0-9]+)?', '<addr>', 'g'),
    '\m0[xX][0-9a-fA-F]+\M', '<hex>', 'g'),
    '\m(?=[a-fA-F]*[0-9])[0-9a-fA-F]{6,}\M', '<hex>', 'g'),
    '[0-9]+', '<n>', 'g')
$$;

-- failure_group_fingerprint is the group's id: 16 hex digits of the md5 of kind ('inbox',
-- 'parked' or 'rejected'), owner (consumer, handler or relay), topic and the error's pattern;
-- failure_fingerprint computes it from the error itself.
CREATE FUNCTION {{schema}}.failure_group_fingerprint(kind text, owner text, topic text, pattern text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT left(md5(kind || chr(31) || coalesce(owner, '') || chr(31) || coalesce(topic, '') || chr(31) || coalesce(pattern, '')), 16)
$$;
CREATE FUNCTION {{schema}}.failure_fingerprint(kind text, owner text, topic text, err text) RETURNS text
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
SELECT {{schema}}.failure_group_fingerprint(kind, owner, topic, {{schema}}.failure_pattern(err))
$$;

-- Parked messages (outbox.ParkingPublisher: what Watermill's poison queue parks, with its
-- reason_poisoned metadata) are outbox rows; the failure groups find them through this partial
-- index, which holds those rows only, and leave out those an operator replayed or discarded,
-- recorded here (the parked copy itself is forwarded to the poison topic as usual).
CREATE INDEX outbox_parked_idx ON {{schema}}.outbox ("offset") WHERE (metadata->>'reason_poisoned') IS NOT NULL;
CREATE TABLE {{schema}}.outbox_parked_settled (
    "offset"   bigint      NOT NULL PRIMARY KEY, -- the parked copy's outbox row
    action     text        NOT NULL,             -- replay or discard
    settled_at timestamptz NOT NULL DEFAULT now()
);

-- Duplicates per consumer and minute (middleware/once): what the admin page's duplicates
-- charts read, from any process. Duplicates are rare; the middleware adds its count of a
-- consumer at most about once a second, one upsert, so a redelivery storm costs little.
CREATE TABLE {{schema}}.duplicates_per_minute (
    consumer   text        NOT NULL,
    minute     timestamptz NOT NULL,
    duplicates bigint      NOT NULL,
    mismatches bigint      NOT NULL DEFAULT 0, -- duplicates whose payload differed (FingerprintMismatches)
    PRIMARY KEY (consumer, minute)
);
