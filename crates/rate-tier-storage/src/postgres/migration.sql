-- The schema of PostgresStorage: one table of buckets and the functions
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
--
-- The kinds beside the rate keep their state in the same row, in columns
-- that a rate leaves alone (NULL in a row a rate created), so that the
-- rates' statements stay as they are:
--   window  tat_us = -1, log_us the counted requests' timestamps (us),
--           oldest first; expires_us the window after its newest entry
--           (rounded up to the millisecond): by then every entry expired
--   period  tat_us = -2, period_start_us the period's first instant (us),
--           period_count its count; expires_us the next period's start
--           (rounded up to the millisecond)
--   slots   tat_us = -3, slots the slots of a concurrency limit held, in
--           the order they were taken: (id, units, expiry_us) triples,
--           flattened, one per request (the request's id, its cost, when
--           its lease ends unless it is renewed); expires_us the latest
--           expiry: by then every slot is free
-- A negative TAT is no TAT to a rate (read as absent), and a row reads as
-- a window, a period or slots only with its kind's mark and columns: a row of
-- another kind than the check's is absent, and the check's write replaces
-- it (a rate's write by the one-bucket statement or the check function
-- sets tat_us and leaves the other columns: with a TAT of 0 or more the
-- row is a rate's, whatever they hold).
CREATE __UNLOGGED__ TABLE IF NOT EXISTS __TABLE__ (
    key text COLLATE "C" PRIMARY KEY,
    tat_us bigint NOT NULL,
    expires_us bigint NOT NULL,
    log_us bigint[],
    period_start_us bigint,
    period_count bigint,
    slots bigint[]
) WITH (fillfactor = 70);

-- A table of an earlier version (rates only) gets the columns of the other
-- kinds: nullable and without a default, a change of the catalog alone (no
-- rewrite of the table). Looked up first, so that running the migration
-- again takes no lock on the table.
DO $$
BEGIN
    IF (SELECT count(*) FROM pg_attribute
        WHERE attrelid = '__TABLE__'::regclass AND NOT attisdropped
        AND attname IN ('log_us', 'period_start_us', 'period_count', 'slots')) < 4 THEN
        ALTER TABLE __TABLE__
            ADD COLUMN IF NOT EXISTS log_us bigint[],
            ADD COLUMN IF NOT EXISTS period_start_us bigint,
            ADD COLUMN IF NOT EXISTS period_count bigint,
            ADD COLUMN IF NOT EXISTS slots bigint[];
    END IF;
END
$$;

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

-- The time of a decision, in us since the epoch: `at_us`, or when it is
-- NULL the database's clock (clock_timestamp(), the time of the call, not
-- of its transaction). Every function calls it once it holds its keys'
-- locks, so that a decision that waited for a lock is decided at the end
-- of its wait (a time read before the wait would charge, cap or refund
-- the buckets as if it had not been). Beyond gcra-core's range of time
-- (2^53 us, the year 2255) it raises, naming `who`.
CREATE OR REPLACE FUNCTION __TABLE___now(at_us bigint, who text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    now_us bigint := coalesce(at_us, (extract(epoch FROM clock_timestamp()) * 1000000)::bigint);
BEGIN
    IF now_us < 0 OR now_us > 9007199254740992 THEN
        RAISE EXCEPTION '%: time out of range', who;
    END IF;
    RETURN now_us;
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
--                (us), cost (0: a peek, which refuses only while the bucket
--                is in debt), shadow (1: never refuses), the most debt a
--                settlement may leave (us, 0 to 2^50)
-- Returns {allowed_i, remaining_i, retry_after_us_i, reset_after_us_i} for
-- each key, flattened. Refused when an enforced bucket refuses: then no
-- bucket is charged, and one that would have passed says so (allowed 1)
-- with its state uncharged. Bad arguments raise, and nothing is written.
-- The buckets are locked by __TABLE___locked. now_us: the time (us since
-- the epoch); NULL: the database's clock, read once the keys are locked (a
-- time read before a wait for a lock would charge or cap the buckets as if
-- the wait had not been).
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
    now_us := __TABLE___now(now_us, 'rate_tier_check');

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
            -- A peek: never writes, not even a cap; in debt (a TAT more
            -- than tau ahead) it refuses until the debt is paid.
            writes[i] := NULL;
            remains := tau - (tat - now_us);
            IF remains < 0 THEN
                reply[4 * i - 3] := 0; reply[4 * i - 2] := 0;
                reply[4 * i - 1] := -remains; reply[4 * i] := tat - now_us;
                IF args[5 * i - 1] = 0 THEN
                    refused := true;
                END IF;
            ELSE
                reply[4 * i - 3] := 1; reply[4 * i - 2] := remains / t;
                reply[4 * i - 1] := 0; reply[4 * i] := tat - now_us;
            END IF;
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
-- now_us         the time (us since the epoch); NULL: the database's clock,
--                read once the keys are locked
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
    now_us := __TABLE___now(now_us, 'rate_tier_settle');

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

-- A reservation of the next slot in several GCRA buckets, all or nothing:
-- the same rules, to the microsecond, as gcra-core's reserve_all (and the
-- Redis script reserve.lua). The request waits for the earliest instant
-- `go` at which every enforced bucket passes, if that wait is at most the
-- caller's and every enforced quota's (its max debt); then every bucket
-- with a cost is charged as a check at `go` would charge it (a shadow that
-- would refuse then is not), its expiry counted from now. Not reserved,
-- nothing is written but a TAT capped after the clock went back.
--
-- keys           the bucket keys (distinct)
-- args[5i-4..5i] for keys[i], as __TABLE___check_at: T (us), tau (us),
--                cost (0: a peek at now, refused while in debt; an
--                enforced one makes the request wait for its debt's end),
--                shadow (1: never makes the request wait), the most debt
--                (us, 0 to 2^50), which is also the most a reservation
--                may wait
-- max_wait_us    the most the caller waits (us, 0 to 2^53)
-- at_us          the time (us since the epoch); NULL: the database's
--                clock, read once the keys are locked, so that the
--                reservations of one key see a clock that never goes back
-- Returns, flattened: {allowed_i, remaining_i, retry_after_us_i,
-- reset_after_us_i, tat_i} for each key (tat_i: the TAT written, 0 for
-- none), then {reserved, wait_us, by, most_us, now_us} (by: the position,
-- from 1, of the first enforced bucket whose wait is the request's; 0 when
-- none makes it wait). Errors where gcra-core finds one (a cost above the
-- burst of an enforced bucket, or of a shadow charged at go; a time past
-- 2^53 us) and bad arguments raise, and nothing is written.
--
-- The keys are locked by __TABLE___locked (the locks of a check, in the
-- same order): a reservation and a check over the same buckets wait for
-- each other and never deadlock.
CREATE OR REPLACE FUNCTION __TABLE___reserve_at(keys text[], args bigint[], max_wait_us bigint, at_us bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(keys), 0);
    now_us bigint := at_us;
    reply bigint[];
    stored bigint[];
    -- Each bucket where it stands at now (rule 1), and whether capped.
    tats bigint[];
    capped boolean[];
    wait bigint := 0;
    by_key int := 0;
    most bigint := max_wait_us;
    go bigint;
    reserved boolean;
    i int;
    t bigint; tau bigint; cost bigint; debt bigint; tat bigint; cap boolean; ahead bigint; w bigint;
BEGIN
    IF n = 0 THEN
        RAISE EXCEPTION 'rate_tier_reserve: at least one key is required';
    END IF;
    IF coalesce(cardinality(args), 0) <> 5 * n THEN
        RAISE EXCEPTION 'rate_tier_reserve: 5 arguments per key are required (T, tau, cost, shadow, max debt)';
    END IF;
    IF max_wait_us IS NULL OR max_wait_us < 0 OR max_wait_us > 9007199254740992 THEN
        RAISE EXCEPTION 'rate_tier_reserve: the max wait must be 0 to 2^53 us';
    END IF;
    IF (SELECT count(DISTINCT k) FROM unnest(keys) AS k) <> n THEN
        RAISE EXCEPTION 'rate_tier_reserve: the keys must be distinct and not NULL';
    END IF;
    FOR i IN 1..n LOOP
        t := args[5 * i - 4]; tau := args[5 * i - 3]; cost := args[5 * i - 2]; debt := args[5 * i];
        IF t IS NULL OR tau IS NULL OR cost IS NULL OR debt IS NULL
            OR t < 1 OR tau < t OR tau > 1125899906842624 OR cost < 0 OR cost > 4294967295
            OR args[5 * i - 1] IS NULL OR args[5 * i - 1] NOT IN (0, 1)
            OR debt < 0 OR debt > 1125899906842624 THEN
            RAISE EXCEPTION 'rate_tier_reserve: key %: T, tau, cost, shadow or max debt out of range', i;
        END IF;
    END LOOP;

    stored := __TABLE___locked(keys);
    now_us := __TABLE___now(now_us, 'rate_tier_reserve');

    -- Each enforced bucket alone: the wait for its next slot
    -- (Quota::reserve), and the most it lets the request wait.
    tats := array_fill(NULL::bigint, ARRAY[n]);
    capped := array_fill(false, ARRAY[n]);
    FOR i IN 1..n LOOP
        t := args[5 * i - 4]; tau := args[5 * i - 3]; cost := args[5 * i - 2]; debt := args[5 * i];
        tat := now_us;
        IF stored[i] >= now_us AND stored[i] <= 9007199254740992 THEN
            IF stored[i] - now_us > tau + debt THEN
                tat := now_us + tau + debt;
                capped[i] := true;
            ELSE
                tat := stored[i];
            END IF;
        END IF;
        tats[i] := tat;
        -- An enforced peek waits for the end of its debt (a state that
        -- refuses until then).
        IF args[5 * i - 1] = 0 THEN
            IF cost > 0 AND t > tau / cost THEN
                RAISE EXCEPTION 'rate_tier_reserve: key %: cost exceeds the burst: it can never pass', i;
            END IF;
            IF tat + t * cost > 9007199254740992 THEN
                RAISE EXCEPTION 'rate_tier_reserve: key %: time out of range', i;
            END IF;
            w := tat + t * cost - tau - now_us;
            IF w > wait THEN
                wait := w; by_key := i;
            END IF;
            most := least(most, debt);
        END IF;
    END LOOP;

    -- The common slot. go <= 2^53: the wait came from a TAT within it.
    go := now_us + wait;
    reserved := wait <= most;
    reply := array_fill(0::bigint, ARRAY[5 * n + 5]);
    FOR i IN 1..n LOOP
        t := args[5 * i - 4]; tau := args[5 * i - 3]; cost := args[5 * i - 2]; debt := args[5 * i];
        tat := tats[i];
        IF cost = 0 OR NOT reserved THEN
            -- A peek (never a write; refused while in debt), or uncharged:
            -- the bucket as it stands now, with only a capped TAT written
            -- (not by a peek).
            IF cost = 0 AND tat - now_us > tau THEN
                reply[5 * i - 4] := 0; reply[5 * i - 3] := 0;
                reply[5 * i - 2] := tat - now_us - tau;
            ELSE
                reply[5 * i - 4] := 1; reply[5 * i - 3] := greatest(tau - (tat - now_us), 0) / t;
                reply[5 * i - 2] := 0;
            END IF;
            reply[5 * i - 1] := tat - now_us;
            IF cost > 0 AND capped[i] THEN
                reply[5 * i] := tat;
            END IF;
        ELSE
            -- The check at go (Quota::check, rule 1 at go), seen from now.
            IF t > tau / cost THEN
                RAISE EXCEPTION 'rate_tier_reserve: key %: cost exceeds the burst: it can never pass', i;
            END IF;
            tat := go; cap := false;
            IF stored[i] >= go AND stored[i] <= 9007199254740992 THEN
                IF stored[i] - go > tau + debt THEN
                    tat := go + tau + debt; cap := true;
                ELSE
                    tat := stored[i];
                END IF;
            END IF;
            IF tat + t * cost > 9007199254740992 THEN
                RAISE EXCEPTION 'rate_tier_reserve: key %: time out of range', i;
            END IF;
            ahead := tat + t * cost - go;
            IF ahead > tau THEN
                -- A shadow that refuses at go: not charged.
                reply[5 * i - 4] := 0; reply[5 * i - 3] := 0;
                reply[5 * i - 2] := ahead - tau; reply[5 * i - 1] := tat - now_us;
                IF cap THEN
                    reply[5 * i] := tat;
                END IF;
            ELSE
                reply[5 * i - 4] := 1; reply[5 * i - 3] := (tau - ahead) / t;
                reply[5 * i - 2] := 0; reply[5 * i - 1] := ahead + wait;
                reply[5 * i] := go + ahead;
            END IF;
        END IF;
    END LOOP;

    -- The writes, one statement per written key, by primary key (a rate's
    -- row: the other kinds' columns cleared). Every TAT written is ahead
    -- of now.
    FOR i IN 1..n LOOP
        w := reply[5 * i];
        IF w > 0 THEN
            INSERT INTO __TABLE__ AS s (key, tat_us, expires_us)
            VALUES (keys[i], w, now_us + ((w - now_us + 999) / 1000) * 1000)
            ON CONFLICT (key) DO UPDATE SET tat_us = excluded.tat_us, expires_us = excluded.expires_us,
                log_us = NULL, period_start_us = NULL, period_count = NULL, slots = NULL;
        END IF;
    END LOOP;
    reply[5 * n + 1] := CASE WHEN reserved THEN 1 ELSE 0 END;
    reply[5 * n + 2] := wait;
    reply[5 * n + 3] := by_key;
    reply[5 * n + 4] := most;
    reply[5 * n + 5] := now_us;
    RETURN reply;
END
$$;

-- Reservations given back by callers that went away before their slot
-- came: gcra-core's Quota::cancel, a compare and move back, each key on
-- its own, one after the other (the same key twice: the second sees the
-- first's write).
--
-- args[3i-2..3i] for keys[i]: T (us, 1 to 2^50), the cost reserved (0 to
--                2^32 - 1), the TAT the reservation wrote (us, 0 or more)
-- at_us          the time (us since the epoch); NULL: the database's clock,
--                read once the keys are locked
-- Returns for each key 0 (kept: the stored TAT is no longer the
-- reservation's, or it is past: the slot is lost, never handed out twice),
-- 1 (moved back by T * cost) or 2 (the bucket is full again: its row
-- deleted). A row of another kind is kept. The keys are locked as by
-- __TABLE___locked; bad arguments raise, and nothing is written.
CREATE OR REPLACE FUNCTION __TABLE___cancel_at(keys text[], args bigint[], at_us bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(keys), 0);
    now_us bigint := at_us;
    reply bigint[];
    lock_id int;
    i int;
    t bigint; cost bigint; tat bigint; stored bigint; floor_us bigint;
BEGIN
    IF n = 0 THEN
        RAISE EXCEPTION 'rate_tier_cancel: at least one key is required';
    END IF;
    IF coalesce(cardinality(args), 0) <> 3 * n THEN
        RAISE EXCEPTION 'rate_tier_cancel: 3 arguments per key are required (T, cost, TAT)';
    END IF;
    FOR i IN 1..n LOOP
        t := args[3 * i - 2]; cost := args[3 * i - 1]; tat := args[3 * i];
        IF keys[i] IS NULL OR t IS NULL OR cost IS NULL OR tat IS NULL
            OR t < 1 OR t > 1125899906842624 OR cost < 0 OR cost > 4294967295 OR tat < 0 THEN
            RAISE EXCEPTION 'rate_tier_cancel: key %: T, cost or TAT out of range', i;
        END IF;
    END LOOP;

    -- The locks of __TABLE___locked.
    IF n = 1 THEN
        PERFORM pg_advisory_xact_lock(__LOCKS__, hashtext(keys[1]));
    ELSE
        FOR lock_id IN SELECT DISTINCT hashtext(k) FROM unnest(keys) AS k ORDER BY 1 LOOP
            PERFORM pg_advisory_xact_lock(__LOCKS__, lock_id);
        END LOOP;
    END IF;
    now_us := __TABLE___now(now_us, 'rate_tier_cancel');

    reply := array_fill(0::bigint, ARRAY[n]);
    FOR i IN 1..n LOOP
        t := args[3 * i - 2]; cost := args[3 * i - 1]; tat := args[3 * i];
        SELECT s.tat_us INTO stored FROM __TABLE__ AS s WHERE s.key = keys[i];
        CONTINUE WHEN stored IS NULL OR stored <> tat OR tat <= now_us;
        -- Back by T * cost, if that stays ahead of now (compared as
        -- distances: T * cost may be beyond int8).
        IF cost = 0 OR t <= (tat - now_us - 1) / cost THEN
            floor_us := tat - t * cost;
            UPDATE __TABLE__ SET tat_us = floor_us,
                expires_us = now_us + ((floor_us - now_us + 999) / 1000) * 1000
            WHERE key = keys[i];
            reply[i] := 1;
        ELSE
            DELETE FROM __TABLE__ WHERE key = keys[i];
            reply[i] := 2;
        END IF;
    END LOOP;
    RETURN reply;
END
$$;

-- Limits of several kinds decided as one, all or nothing: the same rules,
-- to the microsecond, as gcra-core's kinds (Quota::check and Quota::peek,
-- Window::check, Period::check, Concurrency::acquire over Lease::live)
-- combined as its crate docs say ("Several kinds in one decision"), and as
-- the Redis script decide_mixed.lua (rates, windows and periods):
--
--   1. each limit is decided alone;
--   2. the decision is refused when an enforced limit (not a shadow)
--      refuses;
--   3. allowed: every limit's write is applied;
--   4. refused: no write of a limit that passed (its write is its charge),
--      which replies with a peek (its key as it stands); a refusing limit's
--      write, a repair (a TAT capped after the clock went back, a window's
--      entries ahead of now re-stamped), is applied.
--
-- keys           the bucket keys (distinct)
-- args[6i-5..6i] for keys[i]: tag, a, b, c, cost (0: a peek), shadow (1:
--                never refuses), as decide_mixed.lua's ARGV:
--   tag 0 rate    a = T (us), b = tau (us), c = the most debt a settlement
--                 may leave (us, 0 to 2^50), as __TABLE___check_at
--   tag 1 window  a = limit (1 to 1024), b = window (us, 1 to 2^50), c = 0
--   tag 2 period  a = limit (1 to 2^32 - 1), b = unit (0 day, 1 ISO week,
--                 2 month), c = offset of local time from UTC (s, -64800
--                 to 64800)
--   tag 3 slots   a = limit (1 to 2^32 - 1), b = lease (us, 1 to 2^50), c =
--                 the id of the request's slots (any int8: a u64 as its
--                 bits; 0 for slots without an id): a pass that stands
--                 takes `cost` units under the id, expiring at now + lease
--                 (see __TABLE___release and __TABLE___renew)
-- at_us          the time (us since the epoch); NULL: the database's clock
--                (clock_timestamp()), read once the keys are locked, so
--                that the decisions of one key see a clock that never goes
--                back (a time read before a wait for the lock would stamp a
--                window's entry in the past of one already written)
-- Returns {allowed_i, remaining_i, retry_after_us_i, reset_after_us_i} for
-- each key, flattened. A cost above a limit, a time past 2^53 us (or a
-- period that ends past it) or bad arguments raise, and nothing is written.
--
-- The keys are locked as by __TABLE___locked (the same advisory locks, in
-- the same order), so that a decision here and one of __TABLE___check or
-- the one-bucket statement over the same key wait for each other and never
-- deadlock. What each kind reads from a row is in the table's comment: a
-- row of another kind, or state that is no value of the kind (a log with a
-- NULL or a negative entry, a count beyond 2^32 - 1, slots that are not
-- triples), is absent; a log that is not sorted is corrupt, read as empty
-- and replaced whole (gcra-core's rule), and so are entries beyond 2^53
-- (dropped by the next write). A slot is live while now < expiry <= 2^53
-- with 1 to 2^32 - 1 units; any other (expired, garbage) is dropped by the
-- next write of its row.
CREATE OR REPLACE FUNCTION __TABLE___decide_mixed_at(keys text[], args bigint[], at_us bigint)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(keys), 0);
    now_us bigint := at_us;
    reply bigint[];
    -- Per key, what the decision writes if it stands: w_what 0 nothing,
    -- 1 a TAT (w_a), 2 a log (the entries w_a to w_b of the stored one, then
    -- w_c entries of now), 3 a record (start w_a, count w_b); w_exp its
    -- expiry; 4 slots (the live ones, kept[w_a:w_b], then w_c's expiry
    -- for the request's). peek: for a limit that passed with a charge, the
    -- reset_after of its key as it stands (its reply if the decision is
    -- refused).
    w_what int[];
    w_a bigint[]; w_b bigint[]; w_c bigint[]; w_exp bigint[];
    peek bigint[];
    refused boolean := false;
    lock_id int;
    r record;
    i int; o int;
    tag bigint; a bigint; b bigint; c bigint; cost bigint;
    tat bigint; ahead bigint; remains bigint;
    lo int; len int; expired int; counted int; early int; garbage int;
    e bigint; prev_e bigint; usable boolean; newest bigint; reset_us bigint; kth bigint;
    local_us bigint; day bigint; first_day bigint; span int;
    era bigint; doe bigint; yoe bigint; doy bigint; mp bigint; yr bigint; mon bigint;
    start_us bigint; next_us bigint; have bigint;
    -- The live slots of every slots key, one after the other.
    kept bigint[] := '{}';
    kept_lo int; held bigint; units bigint; latest bigint;
BEGIN
    IF n = 0 THEN
        RAISE EXCEPTION 'rate_tier_decide_mixed: at least one key is required';
    END IF;
    IF coalesce(cardinality(args), 0) <> 6 * n THEN
        RAISE EXCEPTION 'rate_tier_decide_mixed: 6 arguments per key are required (tag, a, b, c, cost, shadow)';
    END IF;
    IF (SELECT count(DISTINCT k) FROM unnest(keys) AS k) <> n THEN
        RAISE EXCEPTION 'rate_tier_decide_mixed: the keys must be distinct and not NULL';
    END IF;
    -- Every argument, before any lock: a bad one raises, and nothing is
    -- written anyway before the end.
    FOR i IN 1..n LOOP
        o := 6 * i - 6;
        tag := args[o + 1]; a := args[o + 2]; b := args[o + 3]; c := args[o + 4]; cost := args[o + 5];
        IF tag IS NULL OR a IS NULL OR b IS NULL OR c IS NULL OR cost IS NULL
            OR cost < 0 OR cost > 4294967295
            OR args[o + 6] IS NULL OR args[o + 6] NOT IN (0, 1) THEN
            RAISE EXCEPTION 'rate_tier_decide_mixed: key %: the cost must be 0 to 2^32 - 1 and shadow 0 or 1', i;
        END IF;
        IF tag = 0 THEN
            IF a < 1 OR b < a OR b > 1125899906842624 OR c < 0 OR c > 1125899906842624 THEN
                RAISE EXCEPTION 'rate_tier_decide_mixed: key %: a rate''s T, tau or max debt out of range', i;
            END IF;
            IF cost > 0 AND a > b / cost THEN
                RAISE EXCEPTION 'rate_tier_decide_mixed: key %: cost exceeds the burst: it can never pass', i;
            END IF;
        ELSIF tag = 1 THEN
            IF a < 1 OR a > 1024 OR b < 1 OR b > 1125899906842624 OR c <> 0 THEN
                RAISE EXCEPTION 'rate_tier_decide_mixed: key %: a window''s limit (1 to 1024), window (1 to 2^50 us) or third argument (0) out of range', i;
            END IF;
        ELSIF tag = 2 THEN
            IF a < 1 OR a > 4294967295 OR b NOT IN (0, 1, 2) OR c < -64800 OR c > 64800 THEN
                RAISE EXCEPTION 'rate_tier_decide_mixed: key %: a period''s limit (1 to 2^32 - 1), unit (0, 1 or 2) or offset (-64800 to 64800 s) out of range', i;
            END IF;
        ELSIF tag = 3 THEN
            IF a < 1 OR a > 4294967295 OR b < 1 OR b > 1125899906842624 THEN
                RAISE EXCEPTION 'rate_tier_decide_mixed: key %: a concurrency limit''s limit (1 to 2^32 - 1) or lease (1 to 2^50 us) out of range', i;
            END IF;
        ELSE
            RAISE EXCEPTION 'rate_tier_decide_mixed: key %: the tag must be 0 (rate), 1 (window), 2 (period) or 3 (concurrency)', i;
        END IF;
        IF tag <> 0 AND cost > a THEN
            RAISE EXCEPTION 'rate_tier_decide_mixed: key %: cost exceeds the limit: it can never pass', i;
        END IF;
    END LOOP;

    -- The locks of __TABLE___locked.
    IF n = 1 THEN
        PERFORM pg_advisory_xact_lock(__LOCKS__, hashtext(keys[1]));
    ELSE
        FOR lock_id IN SELECT DISTINCT hashtext(k) FROM unnest(keys) AS k ORDER BY 1 LOOP
            PERFORM pg_advisory_xact_lock(__LOCKS__, lock_id);
        END LOOP;
    END IF;
    now_us := __TABLE___now(now_us, 'rate_tier_decide_mixed');

    reply := array_fill(0::bigint, ARRAY[4 * n]);
    w_what := array_fill(0, ARRAY[n]);
    w_a := array_fill(NULL::bigint, ARRAY[n]); w_b := w_a; w_c := w_a; w_exp := w_a; peek := w_a;
    -- Each limit alone, its row read once (by primary key).
    FOR r IN
        SELECT u.ord::int AS ord, s.tat_us, s.log_us, s.period_start_us, s.period_count, s.slots
        FROM unnest(keys) WITH ORDINALITY AS u(k, ord)
        LEFT JOIN __TABLE__ AS s ON s.key = u.k
    LOOP
        i := r.ord;
        o := 6 * i - 6;
        tag := args[o + 1]; a := args[o + 2]; b := args[o + 3]; c := args[o + 4]; cost := args[o + 5];

        IF tag = 0 THEN
            -- A rate: __TABLE___check_at's rules, line for line. A = T,
            -- b = tau, c = max debt.
            tat := now_us;
            IF r.tat_us >= now_us AND r.tat_us <= 9007199254740992 THEN
                IF r.tat_us - now_us > b + c THEN
                    tat := now_us + b + c;
                    w_what[i] := 1; w_a[i] := tat;
                ELSE
                    tat := r.tat_us;
                END IF;
            END IF;
            IF cost = 0 THEN
                -- A peek: never a write, not even a cap; refused while in
                -- debt.
                w_what[i] := 0;
                remains := b - (tat - now_us);
                IF remains < 0 THEN
                    reply[4 * i - 3] := 0; reply[4 * i - 2] := 0;
                    reply[4 * i - 1] := -remains; reply[4 * i] := tat - now_us;
                ELSE
                    reply[4 * i - 3] := 1; reply[4 * i - 2] := remains / a;
                    reply[4 * i - 1] := 0; reply[4 * i] := tat - now_us;
                END IF;
            ELSE
                IF tat + a * cost > 9007199254740992 THEN
                    RAISE EXCEPTION 'rate_tier_decide_mixed: key %: time out of range', i;
                END IF;
                ahead := tat + a * cost - now_us;
                IF ahead > b THEN
                    reply[4 * i - 3] := 0; reply[4 * i - 2] := 0;
                    reply[4 * i - 1] := ahead - b; reply[4 * i] := tat - now_us;
                ELSE
                    reply[4 * i - 3] := 1; reply[4 * i - 2] := (b - ahead) / a;
                    reply[4 * i - 1] := 0; reply[4 * i] := ahead;
                    w_what[i] := 1; w_a[i] := now_us + ahead;
                    peek[i] := tat - now_us;
                END IF;
            END IF;
            IF w_what[i] = 1 THEN
                w_exp[i] := now_us + ((w_a[i] - now_us + 999) / 1000) * 1000;
            END IF;

        ELSIF tag = 1 THEN
            -- A window: Window::check. a = limit, b = window.
            -- Rules 2 and 3 in one pass: the entries of a sorted log are
            -- expired (e + W <= now), counted, ahead of now (counted as
            -- now, re-stamped by the next write) or garbage (beyond 2^53,
            -- dropped by it), in that order. Not sorted: corrupt, read as
            -- empty, dropped whole. Not a log (another kind's row, a NULL or
            -- negative entry, more than one dimension): absent.
            len := 0; expired := 0; counted := 0; early := 0; garbage := 0; lo := 1;
            usable := coalesce(r.tat_us = -1, false) AND r.log_us IS NOT NULL
                AND coalesce(array_ndims(r.log_us), 1) = 1
                AND array_position(r.log_us, NULL) IS NULL;
            IF usable THEN
                lo := coalesce(array_lower(r.log_us, 1), 1);
                prev_e := 0;
                FOREACH e IN ARRAY r.log_us LOOP
                    IF e < 0 THEN
                        usable := false;
                        EXIT;
                    END IF;
                    len := len + 1;
                    IF e < prev_e THEN
                        -- Corrupt: every entry is dropped by the next write.
                        -- (A negative entry further on makes it absent: the
                        -- same decision and the same write.)
                        usable := false;
                        EXIT;
                    END IF;
                    prev_e := e;
                    IF e > 9007199254740992 THEN
                        garbage := garbage + 1;
                    ELSIF e > now_us THEN
                        early := early + 1;
                    ELSIF e + b <= now_us THEN
                        expired := expired + 1;
                    ELSE
                        counted := counted + 1;
                    END IF;
                END LOOP;
            END IF;
            IF NOT usable THEN
                len := 0; expired := 0; counted := 0; early := 0; garbage := 0; lo := 1;
            END IF;
            -- The counted entries are r.log_us[lo + expired .. lo + expired
            -- + counted - 1]; the newest counts until it expires (an ahead
            -- entry counts as now).
            IF early > 0 THEN
                reset_us := b;
            ELSIF counted > 0 THEN
                reset_us := r.log_us[lo + expired + counted - 1] + b - now_us;
            ELSE
                reset_us := 0;
            END IF;
            IF cost = 0 THEN
                -- Rule 6: a peek, never a write.
                reply[4 * i - 3] := 1; reply[4 * i - 2] := greatest(a - counted - early, 0);
                reply[4 * i - 1] := 0; reply[4 * i] := reset_us;
            ELSE
                IF counted + early + cost > a THEN
                    -- Rule 4: the k-th oldest counted entry must expire
                    -- first (beyond the counted ones: an ahead one, now).
                    IF counted + early + cost - a <= counted THEN
                        kth := r.log_us[lo + expired + (counted + early + cost - a) - 1];
                    ELSE
                        kth := now_us;
                    END IF;
                    reply[4 * i - 3] := 0; reply[4 * i - 2] := 0;
                    reply[4 * i - 1] := kth + b - now_us; reply[4 * i] := reset_us;
                    -- A refusal's write only re-stamps the ahead entries.
                    IF early > 0 THEN
                        w_what[i] := 2; w_c[i] := early;
                    END IF;
                ELSE
                    -- Rule 5.
                    reply[4 * i - 3] := 1; reply[4 * i - 2] := a - counted - early - cost;
                    reply[4 * i - 1] := 0; reply[4 * i] := b;
                    w_what[i] := 2; w_c[i] := early + cost;
                    peek[i] := reset_us;
                END IF;
                IF w_what[i] = 2 THEN
                    -- The LogWrite: the expired entries dropped from the
                    -- start, the ahead and garbage ones from the end, the
                    -- re-stamped and new ones appended. Every entry then is
                    -- at most now: all have expired a window later.
                    w_a[i] := lo + expired;
                    w_b[i] := lo + len - early - garbage - 1;
                    w_exp[i] := now_us + ((b + 999) / 1000) * 1000;
                END IF;
            END IF;

        ELSIF tag = 3 THEN
            -- Slots: Concurrency::acquire over the units of the live slots
            -- (Lease::live). a = limit, b = lease, c = the request's id.
            -- Not triples (another kind's row, a NULL entry, more than one
            -- dimension, a length not a multiple of 3): absent.
            held := 0; latest := 0; kept_lo := cardinality(kept) + 1;
            IF coalesce(r.tat_us = -3, false) AND r.slots IS NOT NULL
                AND coalesce(array_ndims(r.slots), 1) = 1
                AND cardinality(r.slots) % 3 = 0
                AND array_position(r.slots, NULL) IS NULL THEN
                lo := coalesce(array_lower(r.slots, 1), 1);
                FOR j IN lo..lo + cardinality(r.slots) - 1 BY 3 LOOP
                    units := r.slots[j + 1]; e := r.slots[j + 2];
                    IF units >= 1 AND units <= 4294967295 AND e > now_us AND e <= 9007199254740992 THEN
                        held := held + units;
                        latest := greatest(latest, e);
                        kept := kept || ARRAY[r.slots[j], units, e];
                    END IF;
                END LOOP;
            END IF;
            held := least(held, 4294967295);
            IF cost = 0 THEN
                -- Rule 4: a peek, never a write.
                reply[4 * i - 3] := 1; reply[4 * i - 2] := greatest(a - held, 0);
                reply[4 * i - 1] := 0; reply[4 * i] := 0;
            ELSIF held + cost > a THEN
                -- Rule 2: RETRY_HINT_US, nothing to write.
                reply[4 * i - 3] := 0; reply[4 * i - 2] := 0;
                reply[4 * i - 1] := 1000000; reply[4 * i] := 0;
            ELSE
                -- Rule 3: the live slots and the request's (Lease::expiry).
                IF now_us + b > 9007199254740992 THEN
                    RAISE EXCEPTION 'rate_tier_decide_mixed: key %: time out of range', i;
                END IF;
                reply[4 * i - 3] := 1; reply[4 * i - 2] := a - held - cost;
                reply[4 * i - 1] := 0; reply[4 * i] := 0;
                w_what[i] := 4; w_a[i] := kept_lo; w_b[i] := cardinality(kept);
                w_c[i] := now_us + b; w_exp[i] := greatest(latest, now_us + b);
                peek[i] := 0;
            END IF;

        ELSE
            -- A period: Period::check. a = limit, b = unit, c = offset (s).
            -- Rule 2, in days from 0000-03-01 (719 468 days before the
            -- epoch), where every leap day ends a year.
            local_us := now_us + 719468 * 86400000000 + c * 1000000;
            day := local_us / 86400000000;
            IF b = 0 THEN
                first_day := day; span := 1;
            ELSIF b = 1 THEN
                -- 0000-03-01 was a Wednesday: day + 2 is 0 mod 7 on Mondays.
                first_day := day - (day + 2) % 7; span := 7;
            ELSE
                -- Howard Hinnant's civil_from_days, as period.rs: eras of
                -- 400 years (146 097 days), years from March 1st.
                era := day / 146097;
                doe := day % 146097;
                yoe := (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
                yr := yoe + era * 400;
                doy := doe - (365 * yoe + yoe / 4 - yoe / 100);
                mp := (5 * doy + 2) / 153;
                first_day := day - (doy - (153 * mp + 2) / 5);
                IF mp < 10 THEN
                    mon := mp + 3;
                ELSE
                    mon := mp - 9; yr := yr + 1;
                END IF;
                IF mon = 2 THEN
                    IF yr % 4 = 0 AND (yr % 100 <> 0 OR yr % 400 = 0) THEN
                        span := 29;
                    ELSE
                        span := 28;
                    END IF;
                ELSIF mon IN (4, 6, 9, 11) THEN
                    span := 30;
                ELSE
                    span := 31;
                END IF;
            END IF;
            -- Local midnights as UTC instants; before the epoch: 0.
            start_us := greatest(first_day * 86400000000 - 719468 * 86400000000 - c * 1000000, 0);
            next_us := greatest((first_day + span) * 86400000000 - 719468 * 86400000000 - c * 1000000, 0);
            IF next_us > 9007199254740992 THEN
                RAISE EXCEPTION 'rate_tier_decide_mixed: key %: time out of range', i;
            END IF;
            -- Rule 3: this period's count, or a later one's (the clock went
            -- back); else 0.
            have := 0;
            IF r.tat_us = -2 AND r.period_count >= 0 AND r.period_count <= 4294967295
                AND r.period_start_us >= start_us AND r.period_start_us <= 9007199254740992 THEN
                have := r.period_count;
            END IF;
            reset_us := next_us - now_us;
            IF cost = 0 THEN
                reply[4 * i - 3] := 1; reply[4 * i - 2] := greatest(a - have, 0);
                reply[4 * i - 1] := 0; reply[4 * i] := reset_us;
            ELSIF have + cost > a THEN
                reply[4 * i - 3] := 0; reply[4 * i - 2] := 0;
                reply[4 * i - 1] := reset_us; reply[4 * i] := reset_us;
            ELSE
                reply[4 * i - 3] := 1; reply[4 * i - 2] := a - have - cost;
                reply[4 * i - 1] := 0; reply[4 * i] := reset_us;
                w_what[i] := 3; w_a[i] := start_us; w_b[i] := have + cost;
                w_exp[i] := now_us + ((reset_us + 999) / 1000) * 1000;
                peek[i] := reset_us;
            END IF;
        END IF;

        IF reply[4 * i - 3] = 0 AND args[o + 6] = 0 THEN
            refused := true;
        END IF;
    END LOOP;

    -- The writes: every one if the decision stands; if it is refused, only
    -- the repairs, and a limit that passed replies with its key as it
    -- stands (cost more remaining, the peek's reset). One statement per
    -- written key, by primary key; a write of a kind clears the others'
    -- columns.
    FOR i IN 1..n LOOP
        IF refused AND peek[i] IS NOT NULL THEN
            reply[4 * i - 2] := reply[4 * i - 2] + args[6 * i - 1];
            reply[4 * i] := peek[i];
        ELSIF w_what[i] = 1 THEN
            INSERT INTO __TABLE__ AS s (key, tat_us, expires_us)
            VALUES (keys[i], w_a[i], w_exp[i])
            ON CONFLICT (key) DO UPDATE SET tat_us = excluded.tat_us, expires_us = excluded.expires_us,
                log_us = NULL, period_start_us = NULL, period_count = NULL, slots = NULL;
        ELSIF w_what[i] = 2 THEN
            INSERT INTO __TABLE__ AS s (key, tat_us, expires_us, log_us)
            VALUES (keys[i], -1, w_exp[i], array_fill(now_us, ARRAY[w_c[i]::int]))
            ON CONFLICT (key) DO UPDATE SET tat_us = -1, expires_us = excluded.expires_us,
                log_us = CASE WHEN w_b[i] >= w_a[i]
                    THEN s.log_us[w_a[i]:w_b[i]] || excluded.log_us ELSE excluded.log_us END,
                period_start_us = NULL, period_count = NULL, slots = NULL;
        ELSIF w_what[i] = 3 THEN
            INSERT INTO __TABLE__ AS s (key, tat_us, expires_us, period_start_us, period_count)
            VALUES (keys[i], -2, w_exp[i], w_a[i], w_b[i])
            ON CONFLICT (key) DO UPDATE SET tat_us = -2, expires_us = excluded.expires_us,
                log_us = NULL, period_start_us = excluded.period_start_us,
                period_count = excluded.period_count, slots = NULL;
        ELSIF w_what[i] = 4 THEN
            INSERT INTO __TABLE__ AS s (key, tat_us, expires_us, slots)
            VALUES (keys[i], -3, w_exp[i], kept[w_a[i]:w_b[i]] || ARRAY[args[6 * i - 2], args[6 * i - 1], w_c[i]])
            ON CONFLICT (key) DO UPDATE SET tat_us = -3, expires_us = excluded.expires_us,
                log_us = NULL, period_start_us = NULL, period_count = NULL, slots = excluded.slots;
        END IF;
    END LOOP;
    RETURN reply;
END
$$;

-- The slots of concurrency limits given back (__TABLE___release_at) or
-- kept longer (__TABLE___renew_at), by the id a decision took them under
-- (tag 3 of __TABLE___decide_mixed_at).
--
-- keys           the bucket keys (the same key twice: one after the other)
-- args[2i-1..2i] for keys[i]: the id, then
--   release      the units to give back (0 to 2^32 - 1): at most that many
--                of the id's live slots (all of them for the id of one
--                request, which took its cost), the earliest taken first
--   renew        the lease (us, 1 to 2^50): the id's live slots expire at
--                now + lease; an expired slot is never taken again
-- at_us          the time (us since the epoch); NULL: the database's clock,
--                read once the keys are locked
-- Returns the units given back, or renewed, for each key. Either writes a
-- row only if it changes it: every slot that is no longer live is dropped
-- with them (as by a decision's write), the row's expiry is its latest
-- slot's, and a row left without slots is deleted. A row of another kind
-- (or slots that are not triples) is left as it is. The keys are locked as
-- by __TABLE___locked; bad arguments raise, and nothing is written.
CREATE OR REPLACE FUNCTION __TABLE___slots_at(keys text[], args bigint[], at_us bigint, renewing boolean)
RETURNS bigint[] LANGUAGE plpgsql AS $$
DECLARE
    n int := coalesce(cardinality(keys), 0);
    now_us bigint := at_us;
    who text := CASE WHEN renewing THEN 'rate_tier_renew' ELSE 'rate_tier_release' END;
    reply bigint[];
    lock_id int;
    i int; lo int;
    mark bigint; stored bigint[]; kept bigint[];
    id bigint; v bigint; units bigint; e bigint; give bigint; latest bigint; changed boolean;
BEGIN
    IF n = 0 THEN
        RAISE EXCEPTION '%: at least one key is required', who;
    END IF;
    IF coalesce(cardinality(args), 0) <> 2 * n THEN
        RAISE EXCEPTION '%: 2 arguments per key are required (id, units or lease)', who;
    END IF;
    FOR i IN 1..n LOOP
        v := args[2 * i];
        IF keys[i] IS NULL OR args[2 * i - 1] IS NULL OR v IS NULL
            OR (NOT renewing AND (v < 0 OR v > 4294967295))
            OR (renewing AND (v < 1 OR v > 1125899906842624)) THEN
            RAISE EXCEPTION '%: key %: the id, the units (0 to 2^32 - 1) or the lease (1 to 2^50 us) out of range', who, i;
        END IF;
    END LOOP;

    -- The locks of __TABLE___locked.
    IF n = 1 THEN
        PERFORM pg_advisory_xact_lock(__LOCKS__, hashtext(keys[1]));
    ELSE
        FOR lock_id IN SELECT DISTINCT hashtext(k) FROM unnest(keys) AS k ORDER BY 1 LOOP
            PERFORM pg_advisory_xact_lock(__LOCKS__, lock_id);
        END LOOP;
    END IF;
    now_us := __TABLE___now(now_us, who);
    IF renewing THEN
        FOR i IN 1..n LOOP
            IF now_us + args[2 * i] > 9007199254740992 THEN
                RAISE EXCEPTION '%: key %: time out of range', who, i;
            END IF;
        END LOOP;
    END IF;

    reply := array_fill(0::bigint, ARRAY[n]);
    FOR i IN 1..n LOOP
        SELECT s.tat_us, s.slots INTO mark, stored FROM __TABLE__ AS s WHERE s.key = keys[i];
        CONTINUE WHEN NOT coalesce(mark = -3, false) OR stored IS NULL
            OR coalesce(array_ndims(stored), 1) <> 1
            OR cardinality(stored) % 3 <> 0
            OR array_position(stored, NULL) IS NOT NULL;
        id := args[2 * i - 1]; v := args[2 * i];
        kept := '{}'; latest := 0; changed := false;
        lo := coalesce(array_lower(stored, 1), 1);
        FOR j IN lo..lo + cardinality(stored) - 1 BY 3 LOOP
            units := stored[j + 1]; e := stored[j + 2];
            IF NOT (units >= 1 AND units <= 4294967295 AND e > now_us AND e <= 9007199254740992) THEN
                changed := true;
                CONTINUE;
            END IF;
            IF stored[j] = id THEN
                IF renewing THEN
                    reply[i] := reply[i] + units;
                    IF e <> now_us + v THEN
                        e := now_us + v; changed := true;
                    END IF;
                ELSIF v > 0 THEN
                    give := least(units, v);
                    v := v - give; units := units - give;
                    reply[i] := reply[i] + give; changed := true;
                END IF;
            END IF;
            IF units > 0 THEN
                kept := kept || ARRAY[stored[j], units, e];
                latest := greatest(latest, e);
            END IF;
        END LOOP;
        IF NOT changed THEN
            CONTINUE;
        ELSIF cardinality(kept) = 0 THEN
            DELETE FROM __TABLE__ WHERE key = keys[i];
        ELSE
            UPDATE __TABLE__ SET slots = kept, expires_us = latest WHERE key = keys[i];
        END IF;
    END LOOP;
    RETURN reply;
END
$$;

CREATE OR REPLACE FUNCTION __TABLE___release_at(keys text[], args bigint[], at_us bigint)
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___slots_at(keys, args, at_us, false)
$$;

CREATE OR REPLACE FUNCTION __TABLE___renew_at(keys text[], args bigint[], at_us bigint)
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___slots_at(keys, args, at_us, true)
$$;

-- The entry points: the same functions at the database's clock
-- (`clock_timestamp()`, the time of the call, not of its transaction), read
-- by each once it holds its keys' locks (a NULL time), so that every
-- instance measures against one clock and a decision that waited for a
-- lock is decided at the end of its wait. The `_at` forms take the time as
-- an argument, for tests that drive time.
CREATE OR REPLACE FUNCTION __TABLE___check(keys text[], args bigint[])
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___check_at(keys, args, NULL)
$$;

CREATE OR REPLACE FUNCTION __TABLE___settle(keys text[], args bigint[])
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___settle_at(keys, args, NULL)
$$;

CREATE OR REPLACE FUNCTION __TABLE___decide_mixed(keys text[], args bigint[])
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___decide_mixed_at(keys, args, NULL)
$$;

CREATE OR REPLACE FUNCTION __TABLE___release(keys text[], args bigint[])
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___slots_at(keys, args, NULL, false)
$$;

CREATE OR REPLACE FUNCTION __TABLE___renew(keys text[], args bigint[])
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___slots_at(keys, args, NULL, true)
$$;

CREATE OR REPLACE FUNCTION __TABLE___reserve(keys text[], args bigint[], max_wait_us bigint)
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___reserve_at(keys, args, max_wait_us, NULL)
$$;

CREATE OR REPLACE FUNCTION __TABLE___cancel(keys text[], args bigint[])
RETURNS bigint[] LANGUAGE sql AS $$
    SELECT __TABLE___cancel_at(keys, args, NULL)
$$;

COMMIT;
