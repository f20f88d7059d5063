#!/bin/sh
# Entry point of docker/Dockerfile.redis.
#
#   specdec-redis [redis-server options...]   run redis-server (PID 1 via exec)
#   specdec-redis health                      exit 0 when it answers PING (HEALTHCHECK, probes)
#
# The password comes from the file named by REDIS_PASSWORD_FILE (a mounted secret), else
# from REDIS_PASSWORD, and is handed to redis-server on stdin, redis-cli via REDISCLI_AUTH:
# never on a command line. It must not contain a double quote or a newline.
set -eu
if [ -n "${REDIS_PASSWORD_FILE:-}" ]; then
  password=$(cat "$REDIS_PASSWORD_FILE")
else
  password="${REDIS_PASSWORD:-}"
fi
if [ -z "$password" ]; then
  echo "specdec-redis: set REDIS_PASSWORD_FILE or REDIS_PASSWORD" >&2
  exit 2
fi
if [ "${1:-}" = health ]; then
  REDISCLI_AUTH="$password" redis-cli ping | grep -q PONG
  exit 0
fi
exec redis-server - "$@" <<CONFIG
requirepass "$password"
CONFIG
