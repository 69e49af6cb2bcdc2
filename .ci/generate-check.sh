#!/usr/bin/env bash
# Fails when `go generate ./...` changes a tracked file (or leaves a new one): the generated
# server glue, the models and the example client must be what ports/openapi.yml and the
# oapi-codegen configs produce, never edited by hand nor left behind a spec change.
set -euo pipefail
cd "$(dirname "$0")/.."
go generate ./...
if ! git diff --exit-code --stat; then
  echo "go generate ./... changed the files above: run it and commit the result" >&2
  git diff | head -100 >&2
  exit 1
fi
untracked=$(git ls-files --others --exclude-standard)
if [ -n "$untracked" ]; then
  echo "go generate ./... left files that are not committed:" >&2
  echo "$untracked" >&2
  exit 1
fi
echo "go generate ./...: generated files are up to date"
