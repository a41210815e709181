-- Migration 015's rule: runs of 6 or more hex digits holding a digit, decimal ones too, are <hex>.
CREATE OR REPLACE FUNCTION {{schema}}.failure_pattern(err text) RETURNS text
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
