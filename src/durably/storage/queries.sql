-- Every query durably runs, written once for all dialects.
-- Each query starts with a "-- name: NAME" line, then one line saying what it does
-- (tests/test_queries.py checks both, and that every query is used). Parameters are
-- written :name; each dialect rewrites them to its driver's style when the file is loaded.
-- Status lists are spelled out; tests/test_queries.py checks each against journal.py.
-- Casts are written CAST(x AS TEXT), never x::text, so both dialects read them.

-- name: workflow_columns
-- Not a statement: the columns of a workflow's row as the engine reads it (rows.workflow),
-- embedded in every query that returns whole rows.
workflow_id, name, status, input, version, source_hash, output, error, owner, epoch,
    lease_expires_at, crash_count, wake_at, parent_id, created_at, updated_at,
    cancel_requested, queue, priority, forked_from, forked_from_seq, max_recoveries,
    warnings, deadline_at

-- name: create_workflow
-- Insert a new workflow's row (owned and running, or pending; a pending one is not
-- claimed before its wake_at, a delayed enqueue).
-- Without a conflict target: a taken id and a taken (queue, deduplication_id) both do nothing.
-- Returns the row created (as get_workflow reads it), or no row.
INSERT INTO workflows (workflow_id, name, version, source_hash, status, input, owner, epoch,
                       lease_expires_at, crash_count, parent_id, created_at, updated_at,
                       queue, priority, deduplication_id, started_at, max_recoveries,
                       wake_at, partition_key, debounce_key, deadline_at)
VALUES (:workflow_id, :name, :version, :source_hash, :status, :input, :owner, :epoch,
        :lease_expires_at, 0, :parent_id, :now, :now,
        :queue, :priority, :deduplication_id, :started_at, :max_recoveries,
        :wake_at, :partition_key, :debounce_key, :deadline_at)
ON CONFLICT DO NOTHING
RETURNING {{workflow_columns}}

-- name: create_owned_workflow
-- PostgreSQL only (a data-modifying WITH): create_workflow and, when it created the row,
-- the claim of its start, in one statement; returns the row, as create_workflow does.
WITH created AS (
{{create_workflow}}
), claimed AS (
    INSERT INTO claims (workflow_id, epoch, owner, claimed_at, previous_owner, reason)
    SELECT workflow_id, epoch, owner, created_at, NULL, 'start' FROM created
)
SELECT * FROM created

-- name: supersede_debounced
-- End, as cancelled, the workflows of a queue under a debounce key that have not started
-- (pending, never claimed), but the one just enqueued: a debounced burst keeps its last.
-- Found through workflows_debounced, the other terms kept out of the lookup as keep_lease
-- keeps them (PostgreSQL planned a scan of every pending workflow of the queue).
UPDATE workflows
SET status = 'cancelled', error = :error, wake_at = NULL, updated_at = :now
WHERE queue = :queue AND debounce_key = :debounce_key
  AND (workflow_id <> :workflow_id AND status = 'pending' AND owner IS NULL
       AND started_at IS NULL) IS TRUE

-- name: deduplicated
-- The unfinished workflow of a queue that holds this deduplication id.
SELECT workflow_id FROM workflows
WHERE queue = :queue AND deduplication_id = :deduplication_id
  AND status NOT IN ('completed', 'failed', 'cancelled', 'diverged')

-- name: get_workflow
-- One workflow's row.
SELECT {{workflow_columns}}
FROM workflows WHERE workflow_id = :workflow_id

-- name: search_workflows
-- One page of workflows, newest first: in its WHERE, the terms (search_terms) of the
-- filters given, joined with AND, or TRUE. Only those are written, each a plain
-- comparison an index can serve: a catch-all "(:x IS NULL OR col = :x)" is planned as a
-- scan of every workflow. Written once, its direction left open; the loader
-- (sqlbase.load_queries) makes it oldest first too, as search_workflows_oldest_first.
SELECT {{workflow_columns}}
FROM workflows
WHERE {filters}
ORDER BY created_at {order}, workflow_id
LIMIT :limit OFFSET :offset

-- name: search_terms
-- The term of each filter of search_workflows: the filter, then its term (a line that
-- starts with spaces goes on the term above). {ids} stands for a list of parameters
-- :ids_0, :ids_1, ... (a list parameter is not portable SQL). Beside a list of ids the
-- status, queue and parent are the *_listed terms, on expressions no index serves:
-- SQLite, planning without ANALYZE, would read the list through their index, every
-- workflow of that status, queue or parent.
-- A page after another starts past the (created_at, workflow_id) of the other's last
-- row, written as a range of created_at and a tie-break (an index serves the range).
-- An id prefix matched by few workflows (count_id_range) is also the range of ids that
-- start with it, [:id_from, :id_below), which the primary key serves; its SUBSTR term
-- stays, exact whatever the range holds.
status          status = :status
status_listed   COALESCE(status, '') = :status
name            name = :name
queue           queue = :queue
queue_listed    COALESCE(queue, '') = :queue
parent_id       parent_id = :parent_id
parent_id_listed COALESCE(parent_id, '') = :parent_id
ids             workflow_id IN ({ids})
id_prefix       SUBSTR(workflow_id, 1, LENGTH(CAST(:id_prefix AS TEXT))) = :id_prefix
id_from         workflow_id >= :id_from AND workflow_id < :id_below
created_after   created_at >= :created_after
created_before  created_at < :created_before
after_created   created_at {past}= :after_created
                AND (created_at {past} :after_created OR workflow_id > :after_id)

-- name: count_id_range
-- How many workflows, up to :cap, have an id in [:id_from, :id_below): read off the
-- primary key's index and no further, to choose how a search by id prefix reads
-- (ClaimVerbs.search_workflows).
SELECT COUNT(*) FROM (
    SELECT 1 FROM workflows WHERE workflow_id >= :id_from AND workflow_id < :id_below
    LIMIT :cap
) AS ranged

-- name: pg_server_encoding
-- PostgreSQL only: the server's encoding (PostgresStore._ids_in_code_point_order).
SELECT current_setting('server_encoding')

-- name: pg_text_order
-- PostgreSQL only: the :probe strings as the database's collation sorts them, to learn
-- whether text sorts by code point (PostgresStore._ids_in_code_point_order).
SELECT ARRAY(SELECT x FROM unnest(CAST(:probe AS TEXT[])) AS x ORDER BY x)

-- name: count_unfinished
-- How many unfinished workflows are in each status: one index range over the live and
-- parked ones, however many have finished (the dashboard looks every half second).
SELECT status, COUNT(*) FROM workflows
WHERE status IN ('needs_review', 'pending', 'running', 'sleeping', 'waiting')
GROUP BY status

-- name: count_by_status
-- How many workflows are in each status (statuses with none are absent): every workflow's
-- index entry, a read that grows with history.
SELECT status, COUNT(*) FROM workflows GROUP BY status

-- name: count_status_capped
-- Not a statement alone: how many workflows are in {status}, counting no further than
-- :cap (at most :cap index entries however long the history). ClaimVerbs.count_by_status
-- joins one for every status of journal.Status with UNION ALL: one statement, so one
-- snapshot (a workflow changing status meanwhile is counted once) and one round trip,
-- each status written out so that each planner plans it with what it knows of that
-- status (a correlated subquery over a list of the statuses read every workflow eight
-- times on PostgreSQL).
SELECT '{status}', COUNT(*)
FROM (SELECT 1 FROM workflows WHERE status = '{status}' LIMIT :cap) AS counted

-- name: create_runnable
-- The (name, version) pairs the claiming executor can run, for the claim queries below to
-- join (version '' for an unversioned workflow). A temporary table lives as long as its
-- connection; claim_next refills it only when the pairs changed or what it holds is not
-- known (a new connection, a rollback: sqlbase.TempTables). A source_hash other than ''
-- (a strict executor's) makes only the workflows started by that code, or by unknown
-- code, runnable.
CREATE TEMPORARY TABLE IF NOT EXISTS runnable_here (
    name        TEXT NOT NULL,
    version     TEXT NOT NULL,
    source_hash TEXT NOT NULL
)

-- name: clear_runnable
-- Empty the runnable_here table before claim_next refills it (the runnable pairs changed).
DELETE FROM runnable_here

-- name: add_runnable
-- One (name, version, source hash) this executor can run.
INSERT INTO runnable_here (name, version, source_hash) VALUES (:name, :version, :source_hash)

-- name: claimable_now
-- Not a statement: whether the row w may be claimed now (embedded): unowned, lease gone, or
-- due (a pending workflow's wake_at, when it has one, is the end of its delay), and
-- runnable here.
((status IN ('pending', 'running') AND (owner IS NULL OR lease_expires_at < :now)
  AND (status = 'running' OR wake_at IS NULL OR wake_at <= :now))
 OR (status IN ('sleeping', 'waiting', 'needs_review') AND wake_at <= :now))
AND EXISTS (SELECT 1 FROM runnable_here r
            WHERE r.name = w.name AND r.version = COALESCE(w.version, '')
              AND (r.source_hash = '' OR w.source_hash IS NULL
                   OR r.source_hash = w.source_hash))

-- name: claimable_unqueued
-- Workflows on no queue that may be claimed now (claimable_now), oldest first.
-- The claimable queries end without a locking clause: a dialect whose claimers run
-- concurrently appends one that skips the rows another claimer holds (SqlStore.skip_locked).
SELECT workflow_id, status, owner, epoch
FROM workflows w
WHERE queue IS NULL
  AND {{claimable_now}}
ORDER BY created_at, workflow_id
LIMIT :limit

-- name: claimable_queued
-- Workflows of one queue that may be claimed now, highest priority first.
SELECT workflow_id, status, owner, epoch, started_at
FROM workflows w
WHERE queue = :queue
  AND {{claimable_now}}
ORDER BY priority DESC, created_at, workflow_id
LIMIT :limit

-- name: claimable_cancelled
-- Workflows of one queue asked to stop that may be claimed now, whatever the queue's limits:
-- asked to stop, a workflow holds no place (queue_load), so it waits for none to free before
-- its run delivers the cancel (a parked one of a full queue is woken by it).
SELECT workflow_id, status, owner, epoch
FROM workflows w
WHERE queue = :queue AND cancel_requested = 1
  AND {{claimable_now}}
ORDER BY priority DESC, created_at, workflow_id
LIMIT :limit

-- name: claimable_woken
-- The one workflow of no queue a wake-up named (a signal sent to it, its child ended), if
-- it may be claimed now (claimable_now).
SELECT workflow_id, status, owner, epoch
FROM workflows w
WHERE workflow_id = :workflow_id AND queue IS NULL
  AND {{claimable_now}}

-- name: claimable_partitioned
-- As claimable_queued, for a partitioned queue: its concurrency holds per partition key,
-- so a candidate is taken only while the running workflows of its partition under a live
-- lease, plus the candidates ahead of it in the same partition, leave it a place.
SELECT workflow_id, status, owner, epoch, started_at
FROM workflows w
WHERE workflow_id IN (
    SELECT workflow_id FROM (
        SELECT c.workflow_id,
               ROW_NUMBER() OVER (PARTITION BY COALESCE(c.partition_key, '')
                                  ORDER BY c.priority DESC, c.created_at, c.workflow_id) AS place,
               COALESCE(b.busy, 0) AS busy
        FROM workflows c
        LEFT JOIN (SELECT COALESCE(partition_key, '') AS pk, COUNT(*) AS busy
                   FROM workflows
                   WHERE queue = :queue AND status = 'running' AND owner IS NOT NULL
                     AND lease_expires_at >= :now AND cancel_requested = 0
                   GROUP BY COALESCE(partition_key, '')) b
          ON b.pk = COALESCE(c.partition_key, '')
        WHERE c.queue = :queue
          AND ((c.status IN ('pending', 'running')
                AND (c.owner IS NULL OR c.lease_expires_at < :now)
                AND (c.status = 'running' OR c.wake_at IS NULL OR c.wake_at <= :now))
               OR (c.status IN ('sleeping', 'waiting', 'needs_review') AND c.wake_at <= :now))
          AND EXISTS (SELECT 1 FROM runnable_here r
                      WHERE r.name = c.name AND r.version = COALESCE(c.version, '')
                        AND (r.source_hash = '' OR c.source_hash IS NULL
                             OR r.source_hash = c.source_hash))
    ) ranked
    WHERE place + busy <= :concurrency
)
ORDER BY priority DESC, created_at, workflow_id
LIMIT :limit

-- name: unclaimed
-- Workflows claimable now (as in the claimable queries) by any executor that runs them,
-- oldest first: the engine tells which of them nobody running can take.
SELECT workflow_id, name, version, source_hash, queue
FROM workflows
WHERE ((status IN ('pending', 'running') AND (owner IS NULL OR lease_expires_at < :now)
        AND (status = 'running' OR wake_at IS NULL OR wake_at <= :now))
       OR (status IN ('sleeping', 'waiting', 'needs_review') AND wake_at <= :now))
ORDER BY created_at, workflow_id
LIMIT :limit

-- name: lock_queue
-- Mark a queue claimed from now; it updates no row until create_queue made one.
-- The row lock this update takes makes the claimers of one queue take turns.
UPDATE queues SET claimed_at = :now WHERE name = :queue

-- name: create_queue
-- The row of a queue, the first time it is claimed from.
INSERT INTO queues (name, claimed_at) VALUES (:queue, :now) ON CONFLICT (name) DO NOTHING

-- name: queue_load
-- Running under a live lease in the whole queue, running under this owner, and started
-- (first claimed) since :since. A workflow asked to stop holds no place: its cancel is
-- final, whatever plain code it is still stuck in.
SELECT
    (SELECT COUNT(*) FROM workflows
     WHERE queue = :queue AND status = 'running' AND owner IS NOT NULL
       AND lease_expires_at >= :now AND cancel_requested = 0),
    (SELECT COUNT(*) FROM workflows
     WHERE queue = :queue AND status = 'running' AND owner = :owner
       AND lease_expires_at >= :now AND cancel_requested = 0),
    (SELECT COUNT(*) FROM workflows WHERE queue = :queue AND started_at > :since)

-- name: claim_recovers
-- Not a statement: whether a claim recovers the row (embedded, read before the claim): it
-- was running under an owner whose lease ran out; the claim counts a crash, and records
-- the reason 'recovery' (as ClaimVerbs._take decides for the rows it takes).
(owner IS NOT NULL AND status = 'running')

-- name: claim_row
-- Not a statement: a claim's UPDATE without its WHERE (embedded): new owner, next epoch, a
-- lease, running; a recovery counts a crash (the row's columns are read before the update).
UPDATE workflows
SET owner = :owner, epoch = epoch + 1, lease_expires_at = :lease_expires_at, status = 'running',
    crash_count = crash_count + CASE WHEN {{claim_recovers}} THEN 1 ELSE 0 END,
    started_at = COALESCE(started_at, :now), updated_at = :now

-- name: claim
-- Take a selected workflow at the epoch it was selected at (claim_row).
{{claim_row}}
WHERE workflow_id = :workflow_id AND epoch = :epoch

-- name: insert_claim
-- Record who took the workflow at which epoch, from whom and why.
INSERT INTO claims (workflow_id, epoch, owner, claimed_at, previous_owner, reason)
VALUES (:workflow_id, :epoch, :owner, :now, :previous_owner, :reason)

-- name: claim_and_record
-- PostgreSQL only (a data-modifying WITH): claim and insert_claim of one selected row in
-- one statement, returning the row as get_workflow reads it (no row: it changed hands), so
-- that taking a row is one round trip, not three (ClaimVerbs._take).
WITH taken AS (
{{claim}}
RETURNING {{workflow_columns}}
), recorded AS (
    INSERT INTO claims (workflow_id, epoch, owner, claimed_at, previous_owner, reason)
    SELECT workflow_id, epoch, owner, updated_at, CAST(:previous_owner AS TEXT),
           CAST(:reason AS TEXT)
    FROM taken
)
SELECT * FROM taken

-- name: claim_picked
-- Not a statement: the rest of a one-statement claim after its WITH picked AS (...)
-- (embedded): the claim of every row picked and its record. Returns the rows taken as
-- get_workflow reads them, oldest first, each with the id it was picked as (picked_id); a
-- row picked but not taken (all else NULL) changed hands.
taken AS (
{{claim_row}}
WHERE (workflow_id, epoch) IN (SELECT workflow_id, epoch FROM picked)
RETURNING {{workflow_columns}}
), recorded AS (
    INSERT INTO claims (workflow_id, epoch, owner, claimed_at, previous_owner, reason)
    SELECT t.workflow_id, t.epoch, t.owner, t.updated_at, p.owner, p.reason
    FROM taken t
    JOIN (SELECT workflow_id, owner,
                 CASE WHEN {{claim_recovers}} THEN 'recovery'
                      WHEN epoch > 0 THEN 'resume' ELSE 'start' END AS reason
          FROM picked) p ON p.workflow_id = t.workflow_id
)
SELECT p.workflow_id AS picked_id, t.*
FROM picked p LEFT JOIN taken t ON t.workflow_id = p.workflow_id
ORDER BY t.created_at, p.workflow_id

-- name: claim_unqueued
-- PostgreSQL only (a data-modifying WITH): claimable_unqueued's pick, locked and skipping
-- the rows other claimers hold (SqlStore.skip_locked), the claim of every row picked and
-- its record (claim_picked), in one statement: a pass taking up to :limit workflows is one
-- round trip.
WITH picked AS (
{{claimable_unqueued}}
FOR UPDATE SKIP LOCKED
), {{claim_picked}}

-- name: claim_woken
-- PostgreSQL only: claimable_woken's pick and its claim (claim_picked) in one statement.
WITH picked AS (
{{claimable_woken}}
FOR UPDATE SKIP LOCKED
), {{claim_picked}}

-- name: keep_and_claim_signal
-- PostgreSQL only (a data-modifying WITH): keep_signal and claim_woken in one statement, for
-- a wake-up's one round trip (pg_wakeup), so that the workflow's row is written once: each
-- write of it changes an indexed column (a new entry in every index it is in), and two in a
-- row cost a wake-up about a tenth of its time (twenty-fourth pass of issue 12). The row is
-- locked first (locked: its newest version, which the UPDATE then writes) and every choice
-- is made on it: the signal counted where the workflow has not ended and the key is new, a
-- waiting workflow (or one awaiting a review, whose other task may wait) due now, and the claim where the row as the signal leaves it is
-- claimable (claimable_now on a workflow of no queue, as claim_woken would read it next).
-- One statement reads one row, so a workflow created or resumed by another transaction
-- meanwhile is not taken behind a send refused as unknown or finished. A key used before
-- keeps nothing and wakes nothing, but a row due anyway is still taken. Returns one row
-- (none: no such workflow): as keep_signal, the status, whether the key was used before,
-- whether the signal was counted and whether kept; then the workflow as get_workflow reads
-- it where this claim took it (else NULLs).
WITH dup AS (
    SELECT num FROM signals
    WHERE workflow_id = :workflow_id AND idempotency_key = :idempotency_key
), locked AS (
    SELECT workflow_id, name, version, source_hash, status, owner, epoch, queue,
           lease_expires_at, EXISTS (SELECT 1 FROM dup) AS dup,
           CASE WHEN status IN ('waiting', 'needs_review') AND NOT EXISTS (SELECT 1 FROM dup)
                THEN :now
                ELSE wake_at END AS wake_at
    FROM workflows WHERE workflow_id = :workflow_id
    FOR UPDATE
), was AS (
    SELECT w.*, {{claim_recovers}} AS recovers, (w.queue IS NULL AND {{claimable_now}}) AS take
    FROM locked w
), counted AS (
    UPDATE workflows w
    SET signal_count = w.signal_count + CASE WHEN was.dup THEN 0 ELSE 1 END,
        wake_at = was.wake_at, updated_at = :now,
        owner = CASE WHEN was.take THEN :owner ELSE w.owner END,
        epoch = CASE WHEN was.take THEN w.epoch + 1 ELSE w.epoch END,
        lease_expires_at = CASE WHEN was.take THEN :lease_expires_at
                                ELSE w.lease_expires_at END,
        status = CASE WHEN was.take THEN 'running' ELSE w.status END,
        crash_count = w.crash_count + CASE WHEN was.take AND was.recovers THEN 1 ELSE 0 END,
        started_at = CASE WHEN was.take THEN COALESCE(w.started_at, :now)
                          ELSE w.started_at END
    FROM was
    WHERE w.workflow_id = was.workflow_id
      AND (was.take OR (NOT was.dup
                        AND w.status NOT IN ('completed', 'failed', 'cancelled', 'diverged')))
    RETURNING w.*, was.take AS taken, was.dup AS duplicate
), kept AS (
    INSERT INTO signals (workflow_id, num, name, payload, idempotency_key, sent_at)
    SELECT :workflow_id, signal_count, :name, :payload, :idempotency_key, :now
    FROM counted WHERE NOT duplicate
    ON CONFLICT DO NOTHING
    RETURNING num
), recorded AS (
    INSERT INTO claims (workflow_id, epoch, owner, claimed_at, previous_owner, reason)
    SELECT c.workflow_id, c.epoch, c.owner, c.updated_at, was.owner,
           CASE WHEN was.recovers THEN 'recovery' WHEN was.epoch > 0 THEN 'resume'
                ELSE 'start' END
    FROM counted c, was WHERE c.taken
)
SELECT was.status AS kept_status, was.dup AS kept_duplicate,
       (SELECT COUNT(*) FROM counted WHERE NOT duplicate) AS kept_counted,
       (SELECT COUNT(*) FROM kept) AS kept_kept, t.*
FROM was LEFT JOIN (SELECT {{workflow_columns}} FROM counted WHERE taken) AS t ON true

-- name: load_claims
-- Every change of owner of a workflow, oldest first.
SELECT workflow_id, epoch, owner, claimed_at, previous_owner, reason
FROM claims WHERE workflow_id = :workflow_id ORDER BY epoch

-- name: fence
-- The row of a workflow this epoch still owns: whether cancel was asked, crashes counted,
-- its deadline. The row is found by its key alone and the other terms are checked on it
-- (a LIMIT keeps them out of the lookup; where the row is locked, FOR UPDATE after this,
-- they are checked again on the row as it is once locked): in one WHERE, PostgreSQL
-- planned the lookup as a scan of the owned workflows' index (workflows_by_owner)
-- whenever its statistics had that index empty, reading every dead entry in it, 2.5 ms a
-- step where the key takes 0.05 (sixteenth pass of issue 12).
SELECT cancel_requested, crash_count, deadline_at FROM (
    SELECT epoch, owner, cancel_requested, crash_count, deadline_at FROM workflows
    WHERE workflow_id = :workflow_id LIMIT 1
) AS w
WHERE epoch = :epoch AND owner IS NOT NULL

-- name: progress
-- A new final entry landed: the crashes in a row end.
UPDATE workflows SET crash_count = 0, updated_at = :now
WHERE workflow_id = :workflow_id AND epoch = :epoch

-- name: owner_of
-- Who owns a workflow now (for the message of a fenced write).
SELECT owner, epoch, status FROM workflows WHERE workflow_id = :workflow_id

-- name: entry_conflict
-- Not a statement: the ON CONFLICT clause of every write of a journal entry (embedded):
-- a final entry, or another call's, is never changed.
ON CONFLICT (workflow_id, seq) DO UPDATE
SET kind = excluded.kind, name = excluded.name,
    status = excluded.status, attempt = excluded.attempt, payload = excluded.payload,
    started_at = excluded.started_at, finished_at = excluded.finished_at,
    wake_at = excluded.wake_at,
    args_digest = COALESCE(excluded.args_digest, journal.args_digest)
WHERE journal.status NOT IN ('completed', 'failed', 'timed_out')
  AND ((journal.kind = excluded.kind AND journal.name = excluded.name)
       OR excluded.kind = 'cancel')

-- name: upsert_entry
-- Write a call's entry at its seq; a final entry, or another call's, is never changed.
INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, started_at,
                     finished_at, wake_at, args_digest, follows)
VALUES (:workflow_id, :seq, :kind, :name, :status, :attempt, :payload, :started_at,
        :finished_at, :wake_at, :args_digest, :follows)
{{entry_conflict}}

-- name: fence_and_write_entry
-- The fence and one entry's upsert in one statement (PostgreSQL only: a data-modifying
-- WITH; a step's commit is then one round trip): the row this epoch owns, locked; the
-- entry written only if the fence held, as upsert_entry would; returns what the fence found
-- (no row: it did not hold) and how many entries were written (0: one was there already).
-- A new final entry resets the crashes counted in a row here too, so that the statement is
-- a whole step's commit, and can be sent alone, without BEGIN and COMMIT (``solo``).
WITH fence AS (
{{fence}}
    FOR UPDATE
), written AS (
    INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, started_at,
                         finished_at, wake_at, args_digest, follows)
    SELECT CAST(:workflow_id AS TEXT), CAST(:seq AS BIGINT), CAST(:kind AS TEXT),
           CAST(:name AS TEXT), CAST(:status AS TEXT), CAST(:attempt AS BIGINT),
           CAST(:payload AS TEXT), CAST(:started_at AS DOUBLE PRECISION),
           CAST(:finished_at AS DOUBLE PRECISION), CAST(:wake_at AS DOUBLE PRECISION),
           CAST(:args_digest AS TEXT), CAST(:follows AS BIGINT)
    FROM fence
    {{entry_conflict}}
    RETURNING 1
), progressed AS (
    -- a new final entry ends the crashes in a row (what ``progress`` does after upsert_entry)
    UPDATE workflows SET crash_count = 0, updated_at = :now
    WHERE workflow_id = :workflow_id AND epoch = :epoch AND crash_count > 0
      AND CAST(:status AS TEXT) IN ('completed', 'failed', 'timed_out')
      AND EXISTS (SELECT 1 FROM written)
)
SELECT cancel_requested, crash_count, deadline_at, (SELECT COUNT(*) FROM written) AS written
FROM fence

-- name: entry_at
-- The journal entry at one seq.
SELECT seq, kind, name, status, attempt, payload, started_at, finished_at, wake_at,
       args_digest, follows
FROM journal WHERE workflow_id = :workflow_id AND seq = :seq

-- name: history_mark
-- What tells one state of a workflow's journal and signals from another (HistoryMark),
-- through indexes only: a row of the journal's count and last seq (part 0), one of the
-- signals' count (part 1), then the open entries (part 2, the partial index journal_open).
SELECT 0 AS part, COUNT(*) AS seq, MAX(seq) AS attempt, NULL AS status
FROM journal WHERE workflow_id = :workflow_id
UNION ALL
SELECT 1, COUNT(*), NULL, NULL FROM signals WHERE workflow_id = :workflow_id
UNION ALL
SELECT 2, seq, attempt, status FROM journal
WHERE workflow_id = :workflow_id AND status IN ('started', 'retrying')
ORDER BY 1, 2

-- name: load_history
-- A workflow's journal, in seq order.
SELECT seq, kind, name, status, attempt, payload, started_at, finished_at, wake_at,
       args_digest, follows
FROM journal WHERE workflow_id = :workflow_id ORDER BY seq

-- name: history_page
-- One page of a workflow's journal, read through its primary key (workflow_id, seq), so
-- it costs the page's rows however long the journal: the :limit entries just before
-- :seq, newest first. Written once, its direction left open; the loader
-- (sqlbase.load_queries) makes it oldest first too, the :limit entries just after :seq,
-- as history_page_oldest_first.
SELECT seq, kind, name, status, attempt, payload, started_at, finished_at, wake_at,
       args_digest, follows
FROM journal WHERE workflow_id = :workflow_id AND seq {past} :seq
ORDER BY seq {order}
LIMIT :limit

-- name: history_steps
-- A workflow's step entries whose name starts with :name_prefix, in seq order (the model
-- calls, whose usage a dashboard sums over the whole journal): the journal's other
-- entries are passed over by the database, not sent. A prefix compared as SUBSTR, not
-- LIKE: exact in both dialects, whatever the prefix holds (SQLite's LIKE ignores case).
SELECT seq, kind, name, status, attempt, payload, started_at, finished_at, wake_at,
       args_digest, follows
FROM journal
WHERE workflow_id = :workflow_id AND kind = 'step'
  AND SUBSTR(name, 1, LENGTH(CAST(:name_prefix AS TEXT))) = :name_prefix
ORDER BY seq

-- name: wake_if_waiting
-- (A part of wake_parent and finish_and_wake.) Wake the rows it picks that wait. A finished
-- row is left as it is: a second sending of its finish (after a lost connection) finds its
-- own write by its updated_at, whichever of a parent's and a child's finishes went first.
UPDATE workflows
SET wake_at = CASE WHEN status IN ('waiting', 'needs_review') THEN :now ELSE wake_at END,
    updated_at = CASE WHEN status IN ('completed', 'failed', 'cancelled', 'diverged')
                      THEN updated_at ELSE :now END

-- name: finish_workflow
-- Record the final status and outcome, and let go; returns the parent and queue. With
-- :fenced = 1 it is the fence too, for a workflow nothing can stop now: only the row this
-- epoch owns, no cancel asked, its deadline (if any) not passed; no row otherwise (then the
-- caller fences, to find out why, and finishes with :fenced = 0). A second sending of the
-- same finish (after a lost connection) finds its own write: ended at :now with :status.
UPDATE workflows
SET status = :status, output = :output, error = :error, owner = NULL, lease_expires_at = NULL,
    wake_at = NULL, updated_at = :now
WHERE workflow_id = :workflow_id AND epoch = :epoch
  AND (:fenced = 0 OR (owner IS NOT NULL AND cancel_requested = 0
                       AND (deadline_at IS NULL OR deadline_at > :now))
       OR (owner IS NULL AND status = :status AND updated_at = :now))
RETURNING parent_id, queue

-- name: finish_and_wake
-- PostgreSQL only: finish_workflow (:fenced = 1) and what a finish wakes, in one statement:
-- its parent (wake_if_waiting) and, as notifications, the parent's join and a free place in
-- its queue (:work). Sent alone it is the whole commit, one round trip. No row when the
-- fence did not hold.
WITH done AS (
{{finish_workflow}}
), woken AS (
    {{wake_if_waiting}}
    WHERE workflow_id = (SELECT parent_id FROM done)
), joined AS (
    SELECT json_build_object('k', 'join', 'w', parent_id, 'n', :workflow_id)::text AS wakeup
    FROM done WHERE parent_id IS NOT NULL
), told AS (
    SELECT pg_notify(:channel, CASE WHEN octet_length(wakeup) < 4000 THEN wakeup ELSE :work END)
    FROM joined
    UNION ALL
    SELECT pg_notify(:channel, :work) FROM done WHERE queue IS NOT NULL
)
SELECT (SELECT COUNT(*) FROM told) FROM done

-- name: release_owned
-- Let go of every workflow an executor owns (it is closing).
UPDATE workflows SET owner = NULL, lease_expires_at = NULL, updated_at = :now
WHERE owner = :owner

-- name: release_one
-- Let go of one workflow at its epoch (the run let go cleanly).
UPDATE workflows SET owner = NULL, lease_expires_at = NULL, updated_at = :now
WHERE workflow_id = :workflow_id AND epoch = :epoch

-- name: release_crashed
-- Let go of a workflow whose run ended without recording how: counted as a crash.
UPDATE workflows
SET owner = NULL, lease_expires_at = NULL, crash_count = crash_count + 1, updated_at = :now
WHERE workflow_id = :workflow_id AND epoch = :epoch

-- name: renew_leases
-- Extend the leases of every workflow this owner holds; returns them.
UPDATE workflows SET lease_expires_at = :lease_expires_at WHERE owner = :owner
RETURNING workflow_id, epoch

-- name: keep_lease
-- Extend one lease while this owner still holds it at this epoch (the watchdog's renewal).
-- The row is found by its key alone: "(...) IS TRUE" keeps the other terms out of the
-- lookup, as fence does (PostgreSQL planned them as a scan of workflows_by_owner).
UPDATE workflows SET lease_expires_at = :lease_expires_at
WHERE workflow_id = :workflow_id AND (owner = :owner AND epoch = :epoch) IS TRUE

-- name: expire_leases
-- End every lease of an owner now (it is gone), so others recover at once.
UPDATE workflows SET lease_expires_at = 0 WHERE owner = :owner

-- name: register_executor
-- Record an executor and what it serves (or refresh its heartbeat).
-- Also the heartbeat's: what it serves may have grown since (a module imported later).
-- Its process too: one started again under a fixed executor id, whose last process was
-- killed, must not be judged by that process's pid (found dead: its leases expired).
INSERT INTO executors (executor_id, host, pid, pid_start, started_at, heartbeat_at, serves)
VALUES (:executor_id, :host, :pid, :pid_start, :started_at, :heartbeat_at, :serves)
ON CONFLICT (executor_id) DO UPDATE
SET host = excluded.host, pid = excluded.pid, pid_start = excluded.pid_start,
    started_at = excluded.started_at, heartbeat_at = excluded.heartbeat_at,
    serves = excluded.serves

-- name: list_executors
-- The executors known and what each serves, oldest first.
SELECT executor_id, host, pid, pid_start, started_at, heartbeat_at, serves
FROM executors ORDER BY started_at

-- name: remove_executor
-- Forget an executor that closed.
DELETE FROM executors WHERE executor_id = :executor_id

-- name: applied_migrations
-- The schema versions applied so far.
SELECT version FROM durably_migrations ORDER BY version

-- name: record_migration
-- Record that a migration was applied.
INSERT INTO durably_migrations (version, name, applied_at) VALUES (:version, :name, :now)

-- name: create_migrations_table
-- The table of applied migrations, if missing.
CREATE TABLE IF NOT EXISTS durably_migrations (
    version    BIGINT PRIMARY KEY,
    name       TEXT NOT NULL,
    applied_at DOUBLE PRECISION NOT NULL
)

-- name: park
-- Park a workflow: its waiting status and wake-up time, no owner; returns its queue.
UPDATE workflows
SET status = :status, wake_at = :wake_at, owner = NULL, lease_expires_at = NULL, updated_at = :now
WHERE workflow_id = :workflow_id AND epoch = :epoch
RETURNING queue

-- name: next_wake
-- The earliest wake-up time of any parked workflow, the end of a pending one's delay, or
-- a deadline still to enforce. The wake-ups are one IN list (journal.TIMED_STATUSES):
-- SQLite reads it as a range of workflows_by_wake; an OR of two lists it read through
-- workflows_by_status, every pending and parked row.
SELECT MIN(due) FROM (
    SELECT MIN(wake_at) AS due FROM workflows
    WHERE status IN ('pending', 'sleeping', 'waiting', 'needs_review') AND wake_at IS NOT NULL
    UNION ALL
    SELECT MIN(deadline_at) AS due FROM workflows
    WHERE deadline_at IS NOT NULL AND cancel_requested = 0
      AND status NOT IN ('completed', 'failed', 'cancelled', 'diverged')
) AS wake_ups

-- name: due_deadlines
-- Unfinished workflows past their deadline and not yet asked to stop, earliest first
-- (the predicate of the workflows_deadlines index, so that it serves this).
SELECT workflow_id FROM workflows
WHERE deadline_at IS NOT NULL AND cancel_requested = 0
  AND status NOT IN ('completed', 'failed', 'cancelled', 'diverged')
  AND deadline_at <= :now
ORDER BY deadline_at, workflow_id
LIMIT :limit

-- name: cancels_asked
-- The workflows this owner holds that were asked to stop: a cancel another process asked,
-- read by the owner's recovery pass where no notification tells it (SQLite). Through
-- workflows_by_owner: the rows of its live runs only (a parked or finished row has none).
SELECT workflow_id FROM workflows
WHERE owner = :owner AND cancel_requested = 1

-- name: count_signal
-- Number the next signal to a workflow and wake it if it waits (or awaits a review: another
-- of its tasks may wait for the signal); returns the number.
UPDATE workflows
SET signal_count = signal_count + 1,
    wake_at = CASE WHEN status IN ('waiting', 'needs_review') THEN :now ELSE wake_at END,
    updated_at = :now
WHERE workflow_id = :workflow_id
RETURNING signal_count, status

-- name: keep_signal
-- PostgreSQL only (a data-modifying WITH): count_signal and insert_signal in one statement,
-- for a workflow that exists, has not ended, and has no signal of this key yet, with the
-- wake-up notification when the signal was kept; returns the workflow's status (no row: no
-- such workflow), whether the key was used before, and whether the signal was numbered
-- and kept (the notification only with :tell). The UPDATE takes the row lock that orders
-- senders; of two senders of one key that pass the check at once, the second one's insert
-- does nothing.
WITH dup AS (
    SELECT num FROM signals
    WHERE workflow_id = :workflow_id AND idempotency_key = :idempotency_key
), counted AS (
    UPDATE workflows
    SET signal_count = signal_count + 1,
        wake_at = CASE WHEN status IN ('waiting', 'needs_review') THEN :now ELSE wake_at END,
        updated_at = :now
    WHERE workflow_id = :workflow_id
      AND status NOT IN ('completed', 'failed', 'cancelled', 'diverged')
      AND NOT EXISTS (SELECT 1 FROM dup)
    RETURNING signal_count
), kept AS (
    INSERT INTO signals (workflow_id, num, name, payload, idempotency_key, sent_at)
    SELECT :workflow_id, signal_count, :name, :payload, :idempotency_key, :now FROM counted
    ON CONFLICT DO NOTHING
    RETURNING num
), woken AS (
    SELECT pg_notify(:channel, :wakeup) FROM kept WHERE :tell
)
SELECT status, EXISTS (SELECT 1 FROM dup), (SELECT COUNT(*) FROM counted),
       (SELECT COUNT(*) FROM kept), (SELECT COUNT(*) FROM woken)
FROM workflows WHERE workflow_id = :workflow_id

-- name: signal_by_key
-- A signal already sent to a workflow with this idempotency key.
SELECT num FROM signals WHERE workflow_id = :workflow_id AND idempotency_key = :idempotency_key

-- name: insert_signal
-- Keep a signal sent to a workflow.
-- A key already used does nothing (the caller reads the row count): the second of two
-- senders of one key is told "duplicate", never a unique-index violation.
INSERT INTO signals (workflow_id, num, name, payload, idempotency_key, sent_at)
VALUES (:workflow_id, :num, :name, :payload, :idempotency_key, :now)
ON CONFLICT DO NOTHING

-- name: next_signal
-- The oldest signal of a name the workflow has not yet received.
SELECT num, payload FROM signals
WHERE workflow_id = :workflow_id AND name = :name AND consumed_seq IS NULL
ORDER BY num
LIMIT 1

-- name: consume_signal
-- Mark a signal received by the wait at seq.
UPDATE signals SET consumed_seq = :seq WHERE workflow_id = :workflow_id AND num = :num

-- name: give_back_signal
-- Put back in the workflow's queue the signal of :name that the wait at :seq took, a
-- wait_first's loser (decide_race): next_signal finds it where it was, by its num.
UPDATE signals SET consumed_seq = NULL
WHERE workflow_id = :workflow_id AND name = :name AND consumed_seq = :seq

-- name: give_back_signals_from
-- Put back in the workflow's queue the signals its entries from :seq on took, as a resume
-- drops those entries (reopen): the run's waits receive them again, in the order sent.
UPDATE signals SET consumed_seq = NULL
WHERE workflow_id = :workflow_id AND consumed_seq >= :seq

-- name: keep_journal_mark
-- Before drop_signal_wait drops the journal's first entry, written since 0013 (its follows
-- set): the entry after it says whom it followed (seq - 1, as none said), else the journal
-- would read as begun before 0013, its first entry following nothing (Replayer).
UPDATE journal SET follows = seq - 1
WHERE workflow_id = :workflow_id AND follows IS NULL
  AND seq = (SELECT MIN(seq) FROM journal WHERE workflow_id = :workflow_id AND seq > :seq)
  AND EXISTS (
    SELECT 1 FROM journal WHERE workflow_id = :workflow_id AND seq = :seq
      AND kind = 'signal' AND name = :name AND follows IS NOT NULL
  )
  AND NOT EXISTS (SELECT 1 FROM journal WHERE workflow_id = :workflow_id AND seq < :seq)

-- name: drop_signal_wait
-- Drop the entry of a wait_first's losing signal wait (decide_race): a replay never starts
-- it, and its seq holds nothing, as a loser's cut before its commit.
DELETE FROM journal
WHERE workflow_id = :workflow_id AND seq = :seq AND kind = 'signal' AND name = :name

-- name: fence_and_next_signal
-- PostgreSQL only: the fence (as fence, its row locked), whether the wait at :seq is final
-- already, and the oldest signal of :name it has not received, in one statement (no row:
-- the fence did not hold).
WITH fence AS (
{{fence}}
FOR UPDATE
)
SELECT fence.cancel_requested, fence.crash_count, fence.deadline_at,
       EXISTS (SELECT 1 FROM journal
               WHERE workflow_id = :workflow_id AND seq = :seq
                 AND status IN ('completed', 'failed', 'timed_out')),
       next.num, next.payload
FROM fence LEFT JOIN LATERAL (
{{next_signal}}
) AS next ON TRUE

-- name: fence_and_receive_signal
-- PostgreSQL only: receive_signal in one statement: the fence (its row locked), whether the
-- wait at :seq is final already, the oldest signal of :name it has not received; where the
-- fence held, the wait is not final and a signal is there, the wait's entry written
-- completed with the signal's payload (finished at :now), the signal consumed by it and the
-- crashes counted in a row ended, as consume_and_write_entry and progress would. Sent alone
-- it is the whole receive, one round trip. No row: the fence did not hold.
WITH fence AS (
{{fence}}
FOR UPDATE
), settled AS (
    SELECT EXISTS (SELECT 1 FROM journal
                   WHERE workflow_id = :workflow_id AND seq = :seq
                     AND status IN ('completed', 'failed', 'timed_out')) AS final
), next AS (
{{next_signal}}
), written AS (
    INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, started_at,
                         finished_at, wake_at, args_digest, follows)
    SELECT CAST(:workflow_id AS TEXT), CAST(:seq AS BIGINT), CAST(:kind AS TEXT),
           CAST(:name AS TEXT), 'completed', CAST(:attempt AS BIGINT), next.payload,
           CAST(:started_at AS DOUBLE PRECISION), CAST(:now AS DOUBLE PRECISION),
           CAST(:wake_at AS DOUBLE PRECISION), CAST(:args_digest AS TEXT),
           CAST(:follows AS BIGINT)
    FROM fence, settled, next
    WHERE NOT settled.final
    {{entry_conflict}}
    RETURNING 1
), consumed AS (
    UPDATE signals SET consumed_seq = :seq
    WHERE workflow_id = :workflow_id AND num = (SELECT num FROM next)
      AND EXISTS (SELECT 1 FROM written)
), progressed AS (
    UPDATE workflows SET crash_count = 0, updated_at = :now
    WHERE workflow_id = :workflow_id AND epoch = :epoch AND crash_count > 0
      AND EXISTS (SELECT 1 FROM written)
)
SELECT fence.cancel_requested, fence.crash_count, fence.deadline_at, settled.final,
       next.num, next.payload, (SELECT COUNT(*) FROM written) AS written
FROM fence CROSS JOIN settled LEFT JOIN next ON TRUE

-- name: receive_taken_signal
-- PostgreSQL only: after claim_woken in the same transaction, the receive of the signal its
-- workflow is parked on, found here as replay.parked_signal_wait finds it (the journal's
-- last entry a started signal wait, every other entry final), where this claim took the
-- row (its owner and lease) and no cancel was asked nor the deadline passed
-- (cancellation.asked): the wait written completed with the oldest signal of its name
-- not yet received, the signal consumed by it and the crashes counted in a row ended, as
-- fence_and_receive_signal writes them. Where the claim took nothing and this
-- transaction kept a signal, the wake-up notification, as tell_signal sends it. Returns
-- the wait's seq and the payload received (NULL: nothing received), and whether it told.
-- "This transaction's" is read from the rows' xmin: the claim's record of the workflow's
-- epoch now, the workflow's newest signal. An owner, lease and time the row holds could
-- be an earlier claim's or send's at the same clock reading (a frozen test clock).
-- The workflow's row is found by its key alone (as the fence finds it: with the other terms
-- in its WHERE, PostgreSQL may scan workflows_by_owner or workflows_by_status, every
-- workflow this executor owns or every running one), and the entries before the wait
-- through journal_open: the non-final statuses are exactly those it holds.
WITH claimed AS (
    SELECT w.cancel_requested, w.deadline_at FROM (
        SELECT workflow_id, epoch, owner, status, cancel_requested, deadline_at
        FROM workflows WHERE workflow_id = :workflow_id LIMIT 1
    ) AS w
    JOIN claims c ON c.workflow_id = w.workflow_id AND c.epoch = w.epoch
    WHERE w.owner = :owner AND w.status = 'running'
      AND c.xmin = pg_current_xact_id_if_assigned()::xid
), last AS (
    SELECT seq, kind, name, status FROM journal
    WHERE workflow_id = :workflow_id
    ORDER BY seq DESC
    LIMIT 1
), parked AS (
    SELECT last.seq, last.name FROM last, claimed
    WHERE last.kind = 'signal' AND last.status = 'started'
      AND claimed.cancel_requested = 0
      AND (claimed.deadline_at IS NULL OR claimed.deadline_at > :now)
      AND NOT EXISTS (SELECT 1 FROM journal o
                      WHERE o.workflow_id = :workflow_id AND o.seq < last.seq
                        AND o.status IN ('started', 'retrying'))
), next AS (
    SELECT parked.seq, s.num, s.payload
    FROM parked CROSS JOIN LATERAL (
        SELECT num, payload FROM signals
        WHERE workflow_id = :workflow_id AND name = parked.name AND consumed_seq IS NULL
        ORDER BY num
        LIMIT 1
    ) AS s
), written AS (
    UPDATE journal SET status = 'completed', payload = next.payload, finished_at = :now
    FROM next
    WHERE journal.workflow_id = :workflow_id AND journal.seq = next.seq
      AND journal.status = 'started'
    RETURNING journal.seq
), consumed AS (
    UPDATE signals SET consumed_seq = next.seq
    FROM next
    WHERE signals.workflow_id = :workflow_id AND signals.num = next.num
      AND EXISTS (SELECT 1 FROM written)
), progressed AS (
    UPDATE workflows SET crash_count = 0, updated_at = :now
    WHERE workflow_id = :workflow_id AND crash_count > 0
      AND EXISTS (SELECT 1 FROM written)
), told AS (
    SELECT pg_notify(:channel, :wakeup)
    WHERE NOT EXISTS (SELECT 1 FROM claimed)
      AND EXISTS (SELECT 1 FROM (SELECT xmin FROM signals WHERE workflow_id = :workflow_id
                                 ORDER BY num DESC LIMIT 1) AS newest
                  WHERE newest.xmin = pg_current_xact_id_if_assigned()::xid)
)
SELECT (SELECT seq FROM written), (SELECT payload FROM next WHERE EXISTS (SELECT 1 FROM written)),
       (SELECT COUNT(*) FROM told)

-- name: consume_and_write_entry
-- PostgreSQL only: consume_signal and upsert_entry in one statement (its row count is the
-- upsert's).
WITH consumed AS (
{{consume_signal}}
)
{{upsert_entry}}

-- name: list_signals
-- Every signal sent to a workflow, in order.
SELECT num, name, payload, idempotency_key, sent_at, consumed_seq
FROM signals WHERE workflow_id = :workflow_id ORDER BY num

-- name: signals_page
-- One page of a workflow's signals, read through their primary key (workflow_id, num), so
-- it costs the page's rows however many signals were sent: the :limit signals just before
-- :num, newest first.
SELECT num, name, payload, idempotency_key, sent_at, consumed_seq
FROM signals WHERE workflow_id = :workflow_id AND num < :num
ORDER BY num DESC
LIMIT :limit

-- name: publish_event
-- Set the value of a workflow's event key.
INSERT INTO events (workflow_id, key, value, seq, updated_at)
VALUES (:workflow_id, :key, :value, :seq, :now)
ON CONFLICT (workflow_id, key) DO UPDATE
SET value = excluded.value, seq = excluded.seq, updated_at = excluded.updated_at

-- name: wake_event_readers
-- Make the parked workflows waiting in get_event for this event due now (their open
-- entry is named "<key> of <workflow id>"): they read it at once, not at their next
-- read's time. Read through journal_open (an open entry's status is in its WHERE).
UPDATE workflows SET wake_at = :now
WHERE status IN ('sleeping', 'waiting', 'needs_review') AND wake_at > :now
  AND workflow_id IN (SELECT workflow_id FROM journal
                      WHERE status IN ('started', 'retrying') AND status = 'started'
                        AND kind = 'get_event' AND name = :label)

-- name: publish_event_and_wake
-- PostgreSQL only (a data-modifying WITH): publish_event and wake_event_readers in one
-- statement, with their notifications: the event's (:event) and, when it made a parked
-- reader due, a claim's (:work). One round trip where three were.
WITH published AS (
{{publish_event}}
RETURNING 1
), woken AS (
{{wake_event_readers}}
RETURNING 1
)
SELECT pg_notify(:channel, :event),
       (SELECT pg_notify(:channel, :work) WHERE EXISTS (SELECT 1 FROM woken)),
       (SELECT COUNT(*) FROM published)

-- name: get_event
-- The value of a workflow's event key.
SELECT value FROM events WHERE workflow_id = :workflow_id AND key = :key

-- name: live_events
-- One event key's value in each waiting and running workflow that published it, newest
-- first, up to :limit of each status (the pending approvals of a dashboard's look, every
-- half second: one statement, where it was two reads for each live workflow). Each status
-- reads workflows_by_status from its end and the events' primary key for each; the ties
-- of a batch started at once are broken by id, so a look sees the same order each time.
SELECT part, workflow_id, value, created_at FROM (
    SELECT 0 AS part, w.workflow_id, e.value, w.created_at FROM workflows w
    JOIN events e ON e.workflow_id = w.workflow_id AND e.key = :key
    WHERE w.status = 'waiting'
    ORDER BY w.created_at DESC, w.workflow_id DESC
    LIMIT :limit
) AS waiting
UNION ALL
SELECT part, workflow_id, value, created_at FROM (
    SELECT 1 AS part, w.workflow_id, e.value, w.created_at FROM workflows w
    JOIN events e ON e.workflow_id = w.workflow_id AND e.key = :key
    WHERE w.status = 'running'
    ORDER BY w.created_at DESC, w.workflow_id DESC
    LIMIT :limit
) AS running
ORDER BY part, created_at DESC, workflow_id DESC

-- name: wake_parent
-- A child ended: wake its parent if it waits.
{{wake_if_waiting}}
WHERE workflow_id = :parent_id

-- name: request_cancel
-- Ask an unfinished workflow to stop, waking it if parked.
UPDATE workflows
SET cancel_requested = 1,
    wake_at = CASE WHEN status IN ('sleeping', 'waiting', 'needs_review') THEN :now
                   ELSE wake_at END,
    updated_at = :now
WHERE workflow_id = :workflow_id
  AND status NOT IN ('completed', 'failed', 'cancelled', 'diverged')

-- name: cancel_unstarted
-- A workflow never claimed (pending, epoch 0) is cancelled at once: its code never runs.
-- Returns its parent.
UPDATE workflows
SET status = 'cancelled', cancel_requested = 1, error = :error, wake_at = NULL,
    updated_at = :now
WHERE workflow_id = :workflow_id  -- (found by its key alone, as keep_lease is)
  AND (status = 'pending' AND epoch = 0 AND owner IS NULL) IS TRUE
RETURNING parent_id

-- name: unfinished_children
-- The children of a workflow that have not finished.
SELECT workflow_id FROM workflows
WHERE parent_id = :workflow_id
  AND status NOT IN ('completed', 'failed', 'cancelled', 'diverged')

-- name: reopen
-- Make a failed, cancelled or diverged workflow pending again, from a clean slate (and
-- without its deadline, which would cancel it again at once).
UPDATE workflows
SET status = 'pending', owner = NULL, lease_expires_at = NULL, output = NULL, error = NULL,
    crash_count = 0, cancel_requested = 0, wake_at = NULL, deadline_at = NULL,
    updated_at = :now
WHERE workflow_id = :workflow_id

-- name: dequeue
-- Resume of a workflow still waiting on its queue: it leaves the queue (and any delay), so
-- any executor running its code claims it now, whatever the queue's limits.
UPDATE workflows SET queue = NULL, wake_at = NULL, updated_at = :now
WHERE workflow_id = :workflow_id  -- (found by its key alone, as keep_lease is)
  AND (status = 'pending' AND queue IS NOT NULL) IS TRUE

-- name: delete_entries_from
-- Drop a workflow's journal from seq on.
DELETE FROM journal WHERE workflow_id = :workflow_id AND seq >= :seq

-- name: cancel_delivered
-- Whether a workflow's run has received its cancel (the journal holds its marker).
SELECT 1 FROM journal WHERE workflow_id = :workflow_id AND kind = 'cancel' LIMIT 1

-- name: delete_entry
-- Drop one entry of a workflow's journal (a child's start that did not start it).
DELETE FROM journal WHERE workflow_id = :workflow_id AND seq = :seq

-- name: retry_entry
-- Make a failed step's entry retrying, due now.
UPDATE journal SET status = 'retrying', wake_at = :now
WHERE workflow_id = :workflow_id AND seq = :seq

-- name: first_open_step
-- The first step at or before seq whose outcome is open (an intent, a retry to come).
SELECT seq, name, status, attempt FROM journal
WHERE workflow_id = :workflow_id AND seq <= :seq AND kind = 'step'
  AND status IN ('started', 'retrying')
ORDER BY seq
LIMIT 1

-- name: copy_entries
-- Copy a workflow's journal up to seq under a new id (fork).
INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, started_at,
                     finished_at, wake_at, args_digest, follows)
SELECT :new_id, seq, kind, name, status, attempt, payload, started_at, finished_at, wake_at,
       args_digest, follows
FROM journal WHERE workflow_id = :workflow_id AND seq <= :seq

-- name: copy_events
-- A fork's events: of each key, the value its prefix (seq <= :seq) published last.
INSERT INTO events (workflow_id, key, value, seq, updated_at)
SELECT :new_id, j.name, j.payload, j.seq, :now
FROM journal j
WHERE j.workflow_id = :workflow_id AND j.kind = 'event' AND j.payload IS NOT NULL
  AND j.seq = (SELECT MAX(k.seq) FROM journal k
               WHERE k.workflow_id = j.workflow_id AND k.kind = 'event' AND k.name = j.name
                 AND k.payload IS NOT NULL AND k.seq <= :seq)

-- name: mark_fork
-- Record on the fork the workflow and the last seq it was copied from.
UPDATE workflows SET forked_from = :workflow_id, forked_from_seq = :seq
WHERE workflow_id = :new_id

-- name: open_review
-- Open a review of a step whose outcome nothing could decide.
INSERT INTO reviews (workflow_id, seq, attempt, step, idempotency_key, intent, reason, opened_at)
VALUES (:workflow_id, :seq, :attempt, :step, :idempotency_key, :intent, :reason, :now)
ON CONFLICT (workflow_id, seq, attempt) DO UPDATE
SET decision = NULL, outcome = NULL, decided_by = NULL, decided_at = NULL,
    reason = excluded.reason, opened_at = excluded.opened_at
WHERE reviews.decision = 'cancelled'  -- a cancel closed it; a resume put its intent back

-- name: open_reviews
-- The reviews awaiting a decision, of one workflow or all, oldest first.
SELECT workflow_id, seq, attempt, step, idempotency_key, intent, reason, opened_at,
       decision, outcome, decided_by, decided_at
FROM reviews
WHERE decision IS NULL AND (CAST(:workflow_id AS TEXT) IS NULL OR workflow_id = :workflow_id)
ORDER BY opened_at

-- name: close_open_reviews
-- Close a finished workflow's undecided reviews, as a cancel closes one (a resume that
-- meets the step's intent again opens its review again: open_review).
UPDATE reviews SET decision = 'cancelled', decided_by = :decided_by, decided_at = :now
WHERE workflow_id = :workflow_id AND decision IS NULL

-- name: decide_review
-- Record the decision on a review still open at seq (the one of that attempt, when given).
UPDATE reviews SET decision = :decision, outcome = :outcome, decided_by = :decided_by,
                   decided_at = :now
WHERE workflow_id = :workflow_id AND seq = :seq AND decision IS NULL
  AND (CAST(:attempt AS BIGINT) IS NULL OR attempt = :attempt)

-- name: review_at
-- The latest decision on the review of a step (of one attempt, when given): who decided
-- what, and when.
SELECT decision, decided_by, decided_at FROM reviews
WHERE workflow_id = :workflow_id AND seq = :seq AND decision IS NOT NULL
  AND (CAST(:attempt AS BIGINT) IS NULL OR attempt = :attempt)
ORDER BY attempt DESC
LIMIT 1

-- name: cancelled_review_at
-- The intent of the step at seq when its latest review was closed by a cancel.
SELECT step, attempt, intent, opened_at FROM reviews
WHERE workflow_id = :workflow_id AND seq = :seq
  AND attempt = (SELECT MAX(attempt) FROM reviews WHERE workflow_id = :workflow_id AND seq = :seq)
  AND decision = 'cancelled'

-- name: review_decided
-- A review was decided: the workflow is pending again.
UPDATE workflows SET status = 'pending', wake_at = NULL, updated_at = :now
WHERE workflow_id = :workflow_id  -- (found by its key alone, as keep_lease is)
  AND (status = 'needs_review') IS TRUE

-- name: cancel_delivered
-- Whether the cancellation was delivered (journaled) in the workflow.
SELECT 1 FROM journal WHERE workflow_id = :workflow_id AND kind = 'cancel'

-- --- whole workflows: export, import, prune (storage/bulk.py) ------------------------
-- Each table's columns are listed in the order of bulk.COLUMNS; a migration that adds a
-- column adds it here too (tests/test_archive.py checks them against the schema).

-- name: export_ids
-- The workflows an export selects: of a status, created since a time; oldest first.
SELECT workflow_id FROM workflows
WHERE (CAST(:status AS TEXT) IS NULL OR status = :status)
  AND (CAST(:since AS DOUBLE PRECISION) IS NULL OR created_at >= :since)
ORDER BY created_at, workflow_id

-- name: export_children
-- The children of a workflow, oldest first (exported along with it).
SELECT workflow_id FROM workflows WHERE parent_id = :workflow_id ORDER BY created_at, workflow_id

-- name: export_workflows
-- The workflows rows of one workflow, for an archive.
SELECT workflow_id, name, version, source_hash, status, input, output, error, owner, epoch,
       lease_expires_at, crash_count, wake_at, parent_id, created_at, updated_at,
       cancel_requested, signal_count, queue, priority, deduplication_id, started_at,
       forked_from, forked_from_seq, max_recoveries, partition_key, debounce_key, warnings,
       deadline_at
FROM workflows WHERE workflow_id = :workflow_id

-- name: export_journal
-- The journal rows of one workflow, for an archive.
SELECT workflow_id, seq, kind, name, status, attempt, payload, started_at, finished_at, wake_at,
       args_digest, follows
FROM journal WHERE workflow_id = :workflow_id ORDER BY seq

-- name: export_claims
-- The claims rows of one workflow, for an archive.
SELECT workflow_id, epoch, owner, claimed_at, previous_owner, reason
FROM claims WHERE workflow_id = :workflow_id ORDER BY epoch

-- name: export_signals
-- The signals rows of one workflow, for an archive.
SELECT workflow_id, num, name, payload, idempotency_key, sent_at, consumed_seq
FROM signals WHERE workflow_id = :workflow_id ORDER BY num

-- name: export_events
-- The events rows of one workflow, for an archive.
SELECT workflow_id, key, value, seq, updated_at
FROM events WHERE workflow_id = :workflow_id ORDER BY key

-- name: export_reviews
-- The reviews rows of one workflow, for an archive.
SELECT workflow_id, seq, attempt, step, idempotency_key, intent, reason, opened_at,
       decision, outcome, decided_by, decided_at
FROM reviews WHERE workflow_id = :workflow_id ORDER BY seq, attempt

-- name: import_workflows
-- Imported without an owner: the executor that held it lives elsewhere; the next claim
-- is a resume, not a crash.
INSERT INTO workflows (workflow_id, name, version, source_hash, status, input, output, error,
                       owner, epoch, lease_expires_at, crash_count, wake_at, parent_id,
                       created_at, updated_at, cancel_requested, signal_count, queue, priority,
                       deduplication_id, started_at, forked_from, forked_from_seq,
                       max_recoveries, partition_key, debounce_key, warnings, deadline_at)
VALUES (:workflow_id, :name, :version, :source_hash, :status, :input, :output, :error,
        NULL, :epoch, NULL, :crash_count, :wake_at, :parent_id,
        :created_at, :updated_at, :cancel_requested, :signal_count, :queue, :priority,
        :deduplication_id, :started_at, :forked_from, :forked_from_seq, :max_recoveries,
        :partition_key, :debounce_key, :warnings, :deadline_at)

-- name: import_journal
-- Insert one archived journal row.
INSERT INTO journal (workflow_id, seq, kind, name, status, attempt, payload, started_at,
                     finished_at, wake_at, args_digest, follows)
VALUES (:workflow_id, :seq, :kind, :name, :status, :attempt, :payload, :started_at,
        :finished_at, :wake_at, :args_digest, :follows)

-- name: import_claims
-- Insert one archived claims row.
INSERT INTO claims (workflow_id, epoch, owner, claimed_at, previous_owner, reason)
VALUES (:workflow_id, :epoch, :owner, :claimed_at, :previous_owner, :reason)

-- name: import_signals
-- Insert one archived signals row.
INSERT INTO signals (workflow_id, num, name, payload, idempotency_key, sent_at, consumed_seq)
VALUES (:workflow_id, :num, :name, :payload, :idempotency_key, :sent_at, :consumed_seq)

-- name: import_events
-- Insert one archived events row.
INSERT INTO events (workflow_id, key, value, seq, updated_at)
VALUES (:workflow_id, :key, :value, :seq, :updated_at)

-- name: import_reviews
-- Insert one archived reviews row.
INSERT INTO reviews (workflow_id, seq, attempt, step, idempotency_key, intent, reason,
                     opened_at, decision, outcome, decided_by, decided_at)
VALUES (:workflow_id, :seq, :attempt, :step, :idempotency_key, :intent, :reason,
        :opened_at, :decision, :outcome, :decided_by, :decided_at)

-- name: no_unfinished_child
-- Not a statement: that the workflow of the outer row (named "workflows") started no
-- child that is still unfinished, for prunable and prune_workflows. Such a child's end
-- wakes its parent, and its parent_id names it: the parent stays until its children have
-- finished (read through workflows_by_parent).
NOT EXISTS (SELECT 1 FROM workflows c
            WHERE c.parent_id = workflows.workflow_id
              AND c.status NOT IN ('completed', 'failed', 'cancelled', 'diverged'))

-- name: prunable
-- Finished workflows last changed before :before, but no child whose parent is still
-- there: a running parent's join reads the child's row, and so does a finished one's
-- when it is resumed or forked (a child goes in the pass after its parent); nor a parent
-- with a child still unfinished (no_unfinished_child). A workflow
-- last changed before :before was created before it (but for clocks that disagree: one
-- whose creation is stamped later than its last change waits until the cut passes its
-- creation), which makes the candidates an index range (workflows_by_status) that holds
-- the workflows created before the cut, not every finished one; in no order (an order
-- would sort every candidate, at every batch of a backlog), so the read stops once
-- :limit rows pass. The dialect appends its skip_locked clause (a row another
-- transaction holds is left for the next batch).
SELECT workflow_id FROM workflows
WHERE status IN ('completed', 'failed', 'cancelled', 'diverged')
  AND created_at < :before
  AND (CAST(:status AS TEXT) IS NULL OR status = :status)
  AND updated_at < :before
  AND NOT EXISTS (SELECT 1 FROM workflows p WHERE p.workflow_id = workflows.parent_id)
  AND {{no_unfinished_child}}
LIMIT :limit

-- name: prune_journal
-- Delete the journal rows of the pruned workflows listed (sqlbase.id_list).
DELETE FROM journal WHERE workflow_id IN ({ids})

-- name: prune_claims
-- Delete the claims rows of the pruned workflows listed (sqlbase.id_list).
DELETE FROM claims WHERE workflow_id IN ({ids})

-- name: prune_signals
-- Delete the signals rows of the pruned workflows listed (sqlbase.id_list).
DELETE FROM signals WHERE workflow_id IN ({ids})

-- name: prune_events
-- Delete the events rows of the pruned workflows listed (sqlbase.id_list).
DELETE FROM events WHERE workflow_id IN ({ids})

-- name: prune_reviews
-- Delete the reviews rows of the pruned workflows listed (sqlbase.id_list).
DELETE FROM reviews WHERE workflow_id IN ({ids})

-- name: lock_listed
-- The workflows listed (sqlbase.id_list) that exist, in id order; the dialect appends its
-- lock_row clause: delete_selected locks the rows it selected before reading them again.
SELECT workflow_id FROM workflows WHERE workflow_id IN ({ids}) ORDER BY workflow_id

-- name: delete_workflow
-- delete_workflows: without :force only a finished workflow (checked again as it goes).
DELETE FROM workflows
WHERE workflow_id = :workflow_id
  AND (:force = 1 OR status IN ('completed', 'failed', 'cancelled', 'diverged'))

-- name: prune_workflows
-- Delete the workflows listed (sqlbase.id_list) that are finished and have no unfinished
-- child: both are checked again, so only a finished workflow is ever removed, and never a
-- parent whose child was resumed since it was picked; returns the ids it removed. The
-- check is on COALESCE(status, ''), which no index serves: given a long list, SQLite
-- without ANALYZE would otherwise read it through workflows_by_status, every finished one.
DELETE FROM workflows
WHERE workflow_id IN ({ids})
  AND COALESCE(status, '') IN ('completed', 'failed', 'cancelled', 'diverged')
  AND {{no_unfinished_child}}
RETURNING workflow_id

-- name: warnings_of
-- The warnings noted on a workflow (one a line), or NULL.
SELECT warnings FROM workflows WHERE workflow_id = :workflow_id

-- name: set_warnings
-- Replace the warnings noted on a workflow.
UPDATE workflows SET warnings = :warnings WHERE workflow_id = :workflow_id
