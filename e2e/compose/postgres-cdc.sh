#!/bin/sh
# Run by the postgres image at its first start (docker-entrypoint-initdb.d): the replication
# access and role Debezium's connector needs (docs/cdc.md), as e2e/services sets them up.
# Development only: trust auth, except for wmonce_cdc_password, the role the test of
# cdc.Config.PasswordReference logs in with (its line goes first: the first match wins).
set -e
echo 'host replication all all trust' >>"$PGDATA/pg_hba.conf"
sed -i '1i host all wmonce_cdc_password all scram-sha-256' "$PGDATA/pg_hba.conf"
psql -v ON_ERROR_STOP=1 -U "$POSTGRES_USER" -d "$POSTGRES_DB" -c 'CREATE ROLE wmonce_cdc REPLICATION LOGIN' -c 'CREATE ROLE wmonce_cdc_password REPLICATION LOGIN'
