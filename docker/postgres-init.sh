#!/usr/bin/env bash
# Run once by the postgres image, when its data volume is empty (/docker-entrypoint-initdb.d):
# two databases with a user each, so Airflow's metadata and the transaction log are separate and
# neither user can reach the other's database. Names and passwords come from the environment
# compose.yaml gives the postgres service. psql's :"name" and :'value' quote them safely.
set -euo pipefail

psql -v ON_ERROR_STOP=1 --username "${POSTGRES_USER}" --dbname "${POSTGRES_DB:-${POSTGRES_USER}}" \
  -v airflow_user="${AIRFLOW_DB_USER}" -v airflow_password="${AIRFLOW_DB_PASSWORD}" \
  -v txn_user="${TXN_DB_USER}" -v txn_password="${TXN_DB_PASSWORD}" <<'SQL'
CREATE ROLE :"airflow_user" LOGIN PASSWORD :'airflow_password';
CREATE DATABASE airflow OWNER :"airflow_user";
REVOKE ALL ON DATABASE airflow FROM PUBLIC;

CREATE ROLE :"txn_user" LOGIN PASSWORD :'txn_password';
CREATE DATABASE txn OWNER :"txn_user";
REVOKE ALL ON DATABASE txn FROM PUBLIC;
SQL
