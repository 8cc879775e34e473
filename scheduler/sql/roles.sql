-- The runtime roles (scheduler/store/database_roles.py): each statement that names a role
-- or a table is built here by format() (%I quotes identifiers, %L literals),
-- never by pasting strings together in Python. Run by the owner.

-- name: role_attributes
SELECT rolcanlogin, rolsuper, rolcreatedb, rolcreaterole, rolreplication, rolbypassrls, rolinherit
FROM pg_roles WHERE rolname = $1;

-- name: create_role_sql
SELECT format('CREATE ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT',
              $1::text);

-- name: alter_role_sql
SELECT format('ALTER ROLE %I LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS NOINHERIT',
              $1::text);

-- name: set_password_sql
-- $2 is a SCRAM-SHA-256 verifier made by the caller: the password itself never reaches the server.
SELECT format('ALTER ROLE %I PASSWORD %L', $1::text, $2::text);

-- name: revoke_tables_sql
SELECT format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM %I', current_schema(), $1::text);

-- name: grant_table_sql
-- $1 is a privilege list checked against a fixed set by the caller.
SELECT format('GRANT %s ON TABLE %I.%I TO %I', $1::text, current_schema(), $2::text, $3::text);

-- name: grant_connect_sql
SELECT format('GRANT CONNECT ON DATABASE %I TO %I', current_database(), $1::text);

-- name: grant_schema_usage_sql
SELECT format('GRANT USAGE ON SCHEMA %I TO %I', current_schema(), $1::text);

-- name: grant_sequences_sql
SELECT format('GRANT USAGE ON ALL SEQUENCES IN SCHEMA %I TO %I', current_schema(), $1::text);

-- name: grant_function_sql
-- $1 names a function with its argument types (regprocedure), e.g. 'agentrt_retention_purge(integer,boolean)'.
SELECT format('GRANT EXECUTE ON FUNCTION %s TO %I', $1::regprocedure, $2::text);

-- name: revoke_function_sql
SELECT format('REVOKE EXECUTE ON FUNCTION %s FROM %I', $1::regprocedure, $2::text);

-- name: table_privileges
-- Every privilege the role holds on every table of the schema, through PUBLIC and memberships too.
SELECT c.relname AS table_name, p.privilege
FROM pg_class c
JOIN pg_namespace n ON n.oid = c.relnamespace
CROSS JOIN unnest(ARRAY['SELECT', 'INSERT', 'UPDATE', 'DELETE', 'TRUNCATE', 'REFERENCES', 'TRIGGER'])
  AS p(privilege)
WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v', 'm', 'f')
  AND has_table_privilege($1, c.oid, p.privilege)
ORDER BY 1, 2;

-- name: function_privilege
SELECT has_function_privilege($1, $2::regprocedure, 'EXECUTE');

-- name: creation_rights
SELECT has_schema_privilege($1, current_schema(), 'CREATE') AS schema_create,
       has_database_privilege($1, current_database(), 'CREATE') AS database_create,
       has_database_privilege($1, current_database(), 'CONNECT') AS database_connect;
