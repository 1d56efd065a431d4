#!/usr/bin/env bash
# `make sdk`: run under sdk/testing/gateway.py (EAI_SDK_TEST_CONFIG names the live
# gateway): every SDK's tests, the shared scenarios and its README's examples included.
set -euo pipefail
cd "$(dirname "$0")/../.."
export EAI_SDK_REQUIRE=1 GOFLAGS=-mod=mod GOPROXY=off
echo "== python"
.venv/bin/python -m pytest -q -p no:cacheprovider sdk/python/tests
echo "== go"
(cd sdk/go && go test -count=1 ./...)
if [ -d sdk/typescript ]; then
  echo "== typescript"
  (cd sdk/typescript && npm test --silent)
fi
if [ -d sdk/java ]; then
  echo "== java"
  (cd sdk/java && mvn -q -o -Dmaven.repo.local=/usr/share/maven-repo test)
fi
