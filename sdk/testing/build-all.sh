#!/usr/bin/env bash
# `make sdk-build`: build the four SDKs, no test, no server (SPEC §12).
set -euo pipefail
cd "$(dirname "$0")/../.."
export GOFLAGS=-mod=mod GOPROXY=off
echo "== python: enterprise_ai importable from .venv"
.venv/bin/python -c "import enterprise_ai; print('enterprise_ai', enterprise_ai.__version__)"
echo "== go: github.com/enterprise-ai/sdk-go"
(cd sdk/go && go build ./... && go vet ./...)
if [ -d sdk/typescript ]; then
  echo "== typescript: @enterprise-ai/sdk"
  (cd sdk/typescript && npm ci --no-audit --no-fund --silent && npm run --silent build)
fi
if [ -d sdk/java ]; then
  echo "== java: ai.enterprise:enterprise-ai-sdk"
  (cd sdk/java && mvn -q -o -Dmaven.repo.local=/usr/share/maven-repo -DskipTests package)
fi
