#!/usr/bin/env bash
# Vendors the Swagger UI files that GET /docs serves, from the npm package: run it from anywhere
# with the version to take (npm must be installed), then commit the result. The embedded files
# are checked against SHA256SUMS by TestDocsVendoredFiles.
set -euo pipefail
version=${1:?usage: update.sh VERSION (e.g. 5.35.0)}
dest=$(cd "$(dirname "$0")" && pwd)/swagger-ui-dist
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "swagger-ui-dist@$version" >/dev/null && tar xzf "swagger-ui-dist-$version.tgz")
rm -rf "$dest" && mkdir -p "$dest"
for f in LICENSE NOTICE package.json swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css; do
	cp "$tmp/package/$f" "$dest/$f"
done
(cd "$dest" && sha256sum LICENSE NOTICE package.json swagger-ui-bundle.js swagger-ui-bundle.js.LICENSE.txt swagger-ui.css >SHA256SUMS)
echo "swagger-ui-dist $version ($(sha256sum "$tmp/swagger-ui-dist-$version.tgz" | cut -d' ' -f1) is the package's sha256)"
