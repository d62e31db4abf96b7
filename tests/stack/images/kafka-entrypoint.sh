#!/bin/sh
# The official image's settings, as Tansu's flags: the PLAINTEXT listener (":9092" is every
# address) and the advertised one; CLUSTER_ID is read by Tansu from the environment as is.
set -e
listener=$(printf '%s' "${KAFKA_LISTENERS:-PLAINTEXT://:9092}" | tr ',' '\n' | sed -n 's#^PLAINTEXT://##p')
advertised=$(printf '%s' "${KAFKA_ADVERTISED_LISTENERS:-PLAINTEXT://localhost:9092}" | tr ',' '\n' | sed -n 's#^PLAINTEXT://##p')
case "$listener" in :*) listener="0.0.0.0$listener" ;; esac
exec /usr/local/bin/tansu broker \
  --listener-url "tcp://$listener" \
  --advertised-listener-url "tcp://$advertised" \
  --storage-engine memory://tansu/
