-- Index upkeep (scheduler/background/maintenance.py, `agentrt maintain indexes`). Run by the schema's owner:
-- REINDEX and DROP INDEX need ownership of the table. Statements that name an index are built
-- here by format() (%I quotes identifiers), never by pasting strings together in Python.

-- name: btree_indexes
-- Every valid btree index of a table in the schema with its size, its entry count as the last
-- VACUUM or ANALYZE counted it (reltuples; -1 before the first), and the width of an entry
-- estimated from the table's column statistics (pg_stats.avg_width; 16 bytes for a column
-- without statistics yet). The compact size is what a fresh build at the default leaf fillfactor
-- (90) would take: an index tuple is an 8-byte header plus the key, 8-byte aligned, plus a 4-byte
-- line pointer, on a page of 8192 bytes less its 24-byte header and 16-byte btree trailer; and
-- never less than the metapage and one leaf.
WITH idx AS (
  SELECT i.indexrelid, i.indrelid, c.relname AS index_name, t.relname AS table_name,
         c.reltuples, pg_relation_size(c.oid) AS bytes, i.indkey::int2[] AS keys
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indexrelid
  JOIN pg_class t ON t.oid = i.indrelid
  JOIN pg_namespace n ON n.oid = t.relnamespace
  JOIN pg_am am ON am.oid = c.relam
  WHERE n.nspname = current_schema() AND am.amname = 'btree' AND i.indisvalid AND t.relkind = 'r'
), widths AS (
  SELECT idx.indexrelid, sum(coalesce(s.avg_width, 16)) AS key_bytes
  FROM idx
  CROSS JOIN LATERAL unnest(idx.keys) AS k(attnum)
  LEFT JOIN pg_attribute a ON a.attrelid = idx.indrelid AND a.attnum = k.attnum
  LEFT JOIN pg_stats s ON s.schemaname = current_schema() AND s.tablename = idx.table_name
                      AND s.attname = a.attname
  GROUP BY idx.indexrelid
)
SELECT idx.index_name, idx.table_name, idx.bytes, idx.reltuples::bigint AS entries,
       w.key_bytes::int AS key_bytes,
       CASE WHEN idx.reltuples < 0 THEN NULL
            ELSE 8192 * (1 + greatest(1, ceil(idx.reltuples * ((8 + w.key_bytes + 7)::int / 8 * 8 + 4)
                                  / (0.9 * (8192 - 24 - 16)))))::bigint
       END AS compact_bytes
FROM idx JOIN widths w USING (indexrelid)
ORDER BY idx.table_name, idx.index_name;

-- name: leftover_indexes
-- Indexes an interrupted REINDEX CONCURRENTLY leaves behind: invalid, named <index>_ccnew[N]
-- (the new copy, never finished) or <index>_ccold[N] (the old one, never dropped). Writes keep
-- maintaining them until they are dropped.
SELECT c.relname AS index_name, t.relname AS table_name, pg_relation_size(c.oid) AS bytes
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_class t ON t.oid = i.indrelid
JOIN pg_namespace n ON n.oid = t.relnamespace
WHERE n.nspname = current_schema() AND NOT i.indisvalid AND c.relname ~ '_cc(new|old)[0-9]*$'
ORDER BY c.relname;

-- name: owns_indexes_table
-- Whether the connected role may rebuild the index: it owns its table (or is a member of the owner).
SELECT pg_has_role(current_user, t.relowner, 'USAGE')
FROM pg_index i
JOIN pg_class c ON c.oid = i.indexrelid
JOIN pg_class t ON t.oid = i.indrelid
WHERE c.oid = format('%I.%I', current_schema(), $1::text)::regclass;

-- name: reindex_sql
SELECT format('REINDEX INDEX CONCURRENTLY %I.%I', current_schema(), $1::text);

-- name: drop_index_sql
SELECT format('DROP INDEX CONCURRENTLY IF EXISTS %I.%I', current_schema(), $1::text);

-- name: index_bytes
SELECT pg_relation_size(format('%I.%I', current_schema(), $1::text)::regclass);
