#!/usr/bin/env bash
# Regenerates the committed gRPC stubs from proto/. Usage: scripts/gen_proto.sh [OUT_DIR] (default: src).
# tests/unit/test_proto_stubs.py runs this into a temp dir and fails when the committed stubs differ.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:-src}"
python="${PYTHON:-python}"
export PATH="$(dirname "$(command -v "$python")"):$PATH"  # protoc-gen-mypy lives beside the interpreter
"$python" -m grpc_tools.protoc -Iproto \
  --python_out="$out" --grpc_python_out="$out" --mypy_out="$out" --mypy_grpc_out="$out" \
  proto/rackflow/v1/flow.proto
