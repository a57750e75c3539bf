-- The schema of PostgresStorage: one table of buckets and the two functions
-- that decide and settle them, each in one statement. `__TABLE__` is the
-- table's name, `__UNLOGGED__` empty or UNLOGGED, `__LOCKS__` the class of
-- the advisory locks (a 32-bit integer fixed per table). Run it with
-- PostgresStorage::migrate(), or by hand: PostgresStorage::migration_sql()
-- gives it filled in. Running it again changes nothing but the functions.

-- One transaction: two migrations at once (instances starting together)
-- wait for each other instead of failing on a function updated by both.
BEGIN;
SELECT pg_advisory_xact_lock(__LOCKS__, 0);

-- One row per bucket: its key (the same hashed key as Redis, never a user
-- id in clear), its TAT, and when it may be forgotten (the TAT rounded up
-- to the millisecond, as Redis's PX). Neither TAT nor expiry is indexed:
-- both change on every charge, and an index on them would make every
-- update a non-HOT one. The fill factor leaves room on each page for HOT
-- updates.
CREATE __UNLOGGED__ TABLE IF NOT EXISTS __TABLE__ (
    key text COLLATE "C" PRIMARY KEY,
    tat_us bigint NOT NULL,
    expires_us bigint NOT NULL
) WITH (fillfactor = 70);

-- The buckets of `keys`, locked until the end of the transaction, and their
-- stored TATs in the order of `keys` (NULL: no row). The locks are
-- transaction advisory locks taken in one order (of the keys' hashes)
-- whatever the order of the keys: two decisions over the same buckets wait
-- for each other and never deadlock, and a bucket that has no row yet is
-- locked as well as one that has.
CREATE OR REPLACE FUNCTION __TABLE___locked(keys text[])
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    lock_id int;
    stored bigint[];
BEGIN
    -- One bucket (the common case): one lock, one read by primary key.
    IF cardinality(keys) = 1 THEN
        PERFORM pg_advisory_xact_lock(__LOCKS__, hashtext(keys[1]));
        RETURN ARRAY[(SELECT b.tat_us FROM __TABLE__ AS b WHERE b.key = keys[1])];
    END IF;
    FOR lock_id IN SELECT DISTINCT hashtext(k) FROM unnest(keys) AS k ORDER BY 1 LOOP
        PERFORM pg_advisory_xact_lock(__LOCKS__, lock_id);
    END LOOP;
    SELECT array_agg(b.tat_us ORDER BY u.ord) INTO stored
    FROM unnest(keys) WITH ORDINALITY AS u(k, ord)
    LEFT JOIN __TABLE__ AS b ON b.key = u.k;
    RETURN stored;
END
$$;

-- Writes the TATs a decision asks for: `writes[i]` for `keys[i]` (NULL:
-- leave it), each with its expiry (the TAT rounded up to the millisecond,
-- as Redis's PX); a bucket back to full (a TAT of now) is forgotten.
CREATE OR REPLACE FUNCTION __TABLE___store(keys text[], writes bigint[], now_us bigint)
RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    j int;
BEGIN
    -- One statement per written bucket, by primary key (a refusal writes
    -- nothing, and runs none).
    FOR j IN 1..coalesce(cardinality(keys), 0) LOOP
        IF writes[j] = now_us THEN
            DELETE FROM __TABLE__ WHERE key = keys[j];
        ELSIF writes[j] > now_us THEN
            INSERT INTO __TABLE__ AS b (key, tat_us, expires_us)
            VALUES (keys[j], writes[j], now_us + ((writes[j] - now_us + 999) / 1000) * 1000)
            ON CONFLICT (key) DO UPDATE SET tat_us = excluded.tat_us, expires_us = excluded.expires_us;
        END IF;
    END LOOP;
END
$$;

-- Several GCRA buckets decided as one, all or nothing: the same rules, to
-- the microsecond, as gcra-core's check_all and the Redis script
-- gcra_all.lua.
--
-- keys           the bucket keys (distinct)
-- args[5i-4..5i] for keys[i]: emission interval T (us), burst offset tau
--                (us), cost (0: a peek), shadow (1: never refuses), the
--                most debt a settlement may leave (us, 0 to 2^50)
-- Returns {allowed_i, remaining_i, retry_after_us_i, reset_after_us_i} for
-- each key, flattened. Refused when an enforced bucket refuses: then no
-- bucket is charged, and one that would have passed says so (allowed 1)
-- with its state uncharged. Bad arguments raise, and nothing is written.
-- The buckets are locked by __TABLE___locked.
CREATE OR REPLACE FUNCTION __TABLE___check_at(keys text[], args bigint[], now_us bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(keys), 0);
    reply bigint[];
    stored bigint[];
    writes bigint[];
    refused boolean := false;
    i int;
    t bigint; tau bigint; cost bigint; debt bigint; tat bigint; ahead bigint; remains bigint;
BEGIN
    -- gcra-core's range of time: 2^53 us (the year 2255).
    IF now_us IS NULL OR now_us < 0 OR now_us > 9007199254740992 THEN
        RAISE EXCEPTION 'rate_tier_check: time out of range';
    END IF;
    IF n = 0 THEN
        RAISE EXCEPTION 'rate_tier_check: at least one key is required';
    END IF;
    IF coalesce(cardinality(args), 0) <> 5 * n THEN
        RAISE EXCEPTION 'rate_tier_check: 5 arguments per key are required (T, tau, cost, shadow, max debt)';
    END IF;
    -- One bucket, the common case, without a call: its lock and its read.
    IF n = 1 THEN
        PERFORM pg_advisory_xact_lock(__LOCKS__, hashtext(keys[1]));
        stored := ARRAY[(SELECT b.tat_us FROM __TABLE__ AS b WHERE b.key = keys[1])];
    ELSE
        stored := __TABLE___locked(keys);
    END IF;

    reply := array_fill(0::bigint, ARRAY[4 * n]);
    writes := array_fill(NULL::bigint, ARRAY[n]);
    -- One pass: an argument out of range raises, which takes back the
    -- whole statement (nothing is written before the end anyway).
    FOR i IN 1..n LOOP
        t := args[5 * i - 4]; tau := args[5 * i - 3]; cost := args[5 * i - 2]; debt := args[5 * i];
        IF keys[i] IS NULL OR t IS NULL OR tau IS NULL OR cost IS NULL OR debt IS NULL
            OR t < 1 OR tau < t OR tau > 1125899906842624 OR cost < 0 OR cost > 4294967295
            OR args[5 * i - 1] IS NULL OR args[5 * i - 1] NOT IN (0, 1)
            OR debt < 0 OR debt > 1125899906842624 THEN
            RAISE EXCEPTION 'rate_tier_check: key %: T, tau, cost, shadow or max debt out of range', i;
        END IF;
        IF cost > 0 AND t > tau / cost THEN
            RAISE EXCEPTION 'rate_tier_check: key %: cost exceeds the burst: it can never pass', i;
        END IF;
        -- Rule 1: a TAT in the past (or none, or one out of range: a
        -- corrupted value) is now; one more than tau + max debt ahead means
        -- the clock went back: capped.
        tat := now_us;
        IF stored[i] >= now_us AND stored[i] <= 9007199254740992 THEN
            IF stored[i] - now_us > tau + debt THEN
                tat := now_us + tau + debt;
                writes[i] := tat;
            ELSE
                tat := stored[i];
            END IF;
        END IF;
        IF cost = 0 THEN
            -- A peek: never refuses, never writes, not even a cap.
            writes[i] := NULL;
            remains := greatest(tau - (tat - now_us), 0);
            reply[4 * i - 3] := 1; reply[4 * i - 2] := remains / t;
            reply[4 * i - 1] := 0; reply[4 * i] := tat - now_us;
        ELSE
            IF tat + t * cost > 9007199254740992 THEN
                RAISE EXCEPTION 'rate_tier_check: key %: time out of range', i;
            END IF;
            ahead := tat + t * cost - now_us;
            IF ahead > tau THEN
                reply[4 * i - 3] := 0; reply[4 * i - 2] := 0;
                reply[4 * i - 1] := ahead - tau; reply[4 * i] := tat - now_us;
                IF args[5 * i - 1] = 0 THEN
                    refused := true;
                END IF;
            ELSE
                reply[4 * i - 3] := 1; reply[4 * i - 2] := (tau - ahead) / t;
                reply[4 * i - 1] := 0; reply[4 * i] := ahead;
                writes[i] := now_us + ahead;
            END IF;
        END IF;
    END LOOP;

    -- Refused: a bucket that would have passed is not charged, and says how
    -- it stands: cost more remaining, T * cost less ahead.
    IF refused THEN
        FOR i IN 1..n LOOP
            IF reply[4 * i - 3] = 1 AND args[5 * i - 2] > 0 THEN
                reply[4 * i - 2] := reply[4 * i - 2] + args[5 * i - 2];
                reply[4 * i] := reply[4 * i] - args[5 * i - 4] * args[5 * i - 2];
                writes[i] := NULL;
            END IF;
        END LOOP;
    END IF;

    -- One bucket: its write, if any, without a call.
    IF n = 1 THEN
        IF writes[1] IS NOT NULL THEN
            INSERT INTO __TABLE__ AS b (key, tat_us, expires_us)
            VALUES (keys[1], writes[1], now_us + ((writes[1] - now_us + 999) / 1000) * 1000)
            ON CONFLICT (key) DO UPDATE SET tat_us = excluded.tat_us, expires_us = excluded.expires_us;
        END IF;
        RETURN reply;
    END IF;
    PERFORM __TABLE___store(keys, writes, now_us);
    RETURN reply;
END
$$;

-- Settles GCRA buckets after their requests were served: the same rules as
-- gcra-core's Quota::settle and gcra_settle.lua.
--
-- args[4i-3..4i] for keys[i]: T (us), tau (us), units (a positive number
--                charges a debt, at most up to now + tau + max debt; a
--                negative one refunds, never below now; 0 changes nothing),
--                the most debt a settlement may leave (us, 0 to 2^50)
-- Returns {remaining_i, reset_after_us_i} for each key, flattened.
CREATE OR REPLACE FUNCTION __TABLE___settle_at(keys text[], args bigint[], now_us bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(keys), 0);
    reply bigint[];
    stored bigint[];
    writes bigint[];
    i int;
    t bigint; tau bigint; units bigint; ceiling bigint; tat bigint; v bigint; capped boolean;
BEGIN
    -- gcra-core's range of time: 2^53 us (the year 2255).
    IF now_us IS NULL OR now_us < 0 OR now_us > 9007199254740992 THEN
        RAISE EXCEPTION 'rate_tier_settle: time out of range';
    END IF;
    IF n = 0 THEN
        RAISE EXCEPTION 'rate_tier_settle: at least one key is required';
    END IF;
    IF coalesce(cardinality(args), 0) <> 4 * n THEN
        RAISE EXCEPTION 'rate_tier_settle: 4 arguments per key are required (T, tau, units, max debt)';
    END IF;
    FOR i IN 1..n LOOP
        t := args[4 * i - 3]; tau := args[4 * i - 2]; units := args[4 * i - 1];
        IF keys[i] IS NULL OR t IS NULL OR tau IS NULL OR units IS NULL OR args[4 * i] IS NULL
            OR t < 1 OR tau < t OR tau > 1125899906842624
            OR units > 4294967295 OR units < -4294967295
            OR args[4 * i] < 0 OR args[4 * i] > 1125899906842624 THEN
            RAISE EXCEPTION 'rate_tier_settle: key %: T, tau, units or max debt out of range', i;
        END IF;
    END LOOP;

    stored := __TABLE___locked(keys);

    reply := array_fill(0::bigint, ARRAY[2 * n]);
    writes := array_fill(NULL::bigint, ARRAY[n]);
    FOR i IN 1..n LOOP
        t := args[4 * i - 3]; tau := args[4 * i - 2]; units := args[4 * i - 1];
        ceiling := tau + args[4 * i];
        tat := now_us;
        capped := false;
        IF stored[i] >= now_us AND stored[i] <= 9007199254740992 THEN
            IF stored[i] - now_us > ceiling THEN
                tat := now_us + ceiling;
                capped := true;
            ELSE
                tat := stored[i];
            END IF;
        END IF;
        IF units >= 0 THEN
            -- A debt, up to the ceiling (compared as distances: T * units
            -- may be far above it).
            IF units > 0 AND t > (ceiling - (tat - now_us)) / units THEN
                v := now_us + ceiling;
            ELSE
                v := least(tat + t * units, now_us + ceiling);
            END IF;
        ELSE
            -- A refund, never below now.
            IF t > (tat - now_us) / (-units) THEN
                v := now_us;
            ELSE
                v := greatest(tat + t * units, now_us);
            END IF;
        END IF;
        IF v > 9007199254740992 THEN
            RAISE EXCEPTION 'rate_tier_settle: key %: time out of range', i;
        END IF;
        IF v <> tat OR capped THEN
            writes[i] := v;
        END IF;
        reply[2 * i - 1] := greatest(tau - (v - now_us), 0) / t;
        reply[2 * i] := v - now_us;
    END LOOP;

    PERFORM __TABLE___store(keys, writes, now_us);
    RETURN reply;
END
$$;

-- The two entry points: the same functions at the database's clock
-- (`clock_timestamp()`, the time of the call, not of its transaction), so
-- that every instance measures against one clock. The `_at` forms take the
-- time as an argument, for tests that drive time.
CREATE OR REPLACE FUNCTION __TABLE___check(keys text[], args bigint[])
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___check_at(keys, args, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
$$;

CREATE OR REPLACE FUNCTION __TABLE___settle(keys text[], args bigint[])
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___settle_at(keys, args, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint)
$$;

COMMIT;
