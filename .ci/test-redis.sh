#!/usr/bin/env bash
# Runs the given command (the test suite) with a real Redis for the tests, chosen in this order:
#   1. a Docker engine answers (`docker info`): the compose `redis` service, in a project of its own
#      on a free loopback port, exported as REDIS_URL and removed afterwards;
#   2. REDIS_URL is set: used as is (tests namespace their keys);
#   3. redis-server is installed: nothing to start, the tests' helper (adapters/redistest) starts
#      private servers itself;
#   4. otherwise: fail, saying what to install.
# TEST_REDIS=docker|url|local forces a choice (and fails if it is not possible).
set -euo pipefail

if [ $# -eq 0 ]; then
  echo "usage: $0 command [args...]" >&2
  exit 2
fi
cd "$(dirname "$0")/.."

say() { echo "test-redis: $*" >&2; }
mode="${TEST_REDIS:-auto}"
case "$mode" in
  auto | docker | url | local) ;;
  *)
    say "TEST_REDIS must be auto, docker, url or local, got '$mode'"
    exit 2
    ;;
esac

have_docker() {
  docker info >/dev/null 2>&1 && docker compose version >/dev/null 2>&1
}

if [ "$mode" = docker ] || { [ "$mode" = auto ] && have_docker; }; then
  project="checkins-test-$$"
  compose() { REDIS_HOST_PORT='' docker compose -p "$project" -f docker-compose.yml "$@"; }
  cleanup() {
    say "removing compose project $project"
    compose down -v --remove-orphans >/dev/null 2>&1 || true
  }
  trap cleanup EXIT
  trap 'exit 130' INT TERM
  say "Docker engine answers: starting the compose redis service (project $project)"
  compose up -d redis
  container="$(compose ps -q redis)"
  for i in $(seq 1 60); do
    status="$(docker inspect -f '{{.State.Health.Status}}' "$container" 2>/dev/null || echo unknown)"
    [ "$status" = healthy ] && break
    if [ "$i" = 60 ]; then
      say "redis did not become healthy within 60s (status $status)"
      compose logs redis >&2 || true
      exit 1
    fi
    sleep 1
  done
  addr="$(compose port redis 6379)" # e.g. 127.0.0.1:49153
  export REDIS_URL="redis://127.0.0.1:${addr##*:}/0"
  say "redis healthy, REDIS_URL=$REDIS_URL"
  say "running: $*"
  set +e
  "$@"
  rc=$?
  set -e
  exit "$rc"
fi

if [ "$mode" = url ] || { [ "$mode" = auto ] && [ -n "${REDIS_URL:-}" ]; }; then
  if [ -z "${REDIS_URL:-}" ]; then
    say "TEST_REDIS=url but REDIS_URL is empty"
    exit 1
  fi
  # Print the URL without a password.
  say "no Docker engine; using REDIS_URL=$(echo "$REDIS_URL" | sed -E 's#//([^:@/]*):[^@/]*@#//\1:xxxxx@#')"
  say "running: $*"
  exec "$@"
fi

if [ "$mode" = local ] || [ "$mode" = auto ]; then
  if command -v redis-server >/dev/null 2>&1; then
    say "no Docker engine and no REDIS_URL: tests start private servers of $(redis-server --version | cut -d' ' -f1-3)"
    say "running: $*"
    exec "$@"
  fi
fi

say "no Redis for the tests. Install Redis 7 (apt-get install redis-server), or Docker with the"
say "compose plugin (then the compose redis service is used), or set REDIS_URL=redis://host:port/db."
exit 1
