#!/bin/sh
# Run by the postgres image at its first start (docker-entrypoint-initdb.d): the replication
# access and role Debezium's connector needs (docs/cdc.md), as e2e/services sets them up.
# Development only: trust auth.
set -e
echo 'host replication all all trust' >>"$PGDATA/pg_hba.conf"
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -c 'CREATE ROLE wmonce_cdc REPLICATION LOGIN'
