#!/usr/bin/env bash
# One run of every adapter-facing figure, for a new GPU (or driver, or backend) in one go: the adapter and its
# limits, the op suite against its CPU references, decode and prefill throughput with a per-op profile at the
# published shapes (random weights: no download), speculative verification steps of 4 and 8 rows, speculative
# decoding with the model drafting for itself (a chain and a draft tree, each one submission per step), the largest
# shape again with naga's loop bounding kept, and the kernel benches (read ceiling, GEMV, GEMM, attention, the
# few-row GEMMs and tree moves of speculative decoding, InfLLM-v2's ops).
# Each part is a file in OUT_DIR; a part that fails is reported and the rest still run.
#
#   benches/device_report.sh [OUT_DIR]        # builds with cargo (release), writes OUT_DIR (default: device-report)
#   SHADERLM=path/to/shaderlm OPS_TEST=path/to/ops-test OPS_BENCH=path/to/ops-bench benches/device_report.sh
#                                             # prebuilt binaries (`cargo test --release --no-run --test ops`,
#                                             # `cargo bench --no-run --bench ops`) for a machine without Rust
#   QUICK=1 benches/device_report.sh          # the small shapes only (a CPU adapter finishes in minutes)
#   SECS=150                                  # most seconds each part may take
set -uo pipefail
cd "$(dirname "$0")/.."
out=${1:-device-report}
mkdir -p "$out"
secs=${SECS:-150}

if [ -z "${SHADERLM:-}" ] || [ -z "${OPS_TEST:-}" ] || [ -z "${OPS_BENCH:-}" ]; then
  cargo build --release --quiet || exit 1
  SHADERLM=${SHADERLM:-target/release/shaderlm}
  OPS_TEST=${OPS_TEST:-$(cargo test --release --no-run --test ops --message-format short 2>&1 |
    sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)}
  OPS_BENCH=${OPS_BENCH:-$(cargo bench --no-run --bench ops --message-format short 2>&1 |
    sed -n 's/.*Executable .*(\(.*\))$/\1/p' | tail -n 1)}
fi

failed=()
# part NAME COMMAND...: run COMMAND for at most $secs seconds, its output into $out/NAME.md and on the terminal.
part() {
  local name=$1
  shift
  echo "== $name: $*"
  if ! timeout "$secs" "$@" 2>&1 | tee "$out/$name.md"; then
    failed+=("$name")
  fi
}

part devices "$SHADERLM" devices
if [ -n "${QUICK:-}" ]; then
  shapes=("smollm2-135m Q4_1")
  gen=(-p 128 -n 32 -r 1)
else
  shapes=("smollm2-135m Q4_1" "qwen2.5-0.5b Q4_0" "llama-1b Q4_0" "llama-8b Q4_0")
  gen=(-p 512 -n 128 -r 3)
fi
for s in "${shapes[@]}"; do
  read -r shape ty <<<"$s"
  part "bench-$shape-$ty" "$SHADERLM" bench --synthetic "$shape" --synthetic-type "$ty" "${gen[@]}" --profile
done
# The last shape again with naga's loop bounding kept in every shader (dropped by default), to compare.
part "bench-$shape-$ty-loop-bounding" "$SHADERLM" --loop-bounding bench --synthetic "$shape" --synthetic-type "$ty" \
  "${gen[@]}" --profile
# Speculative verification steps of 4 and 8 rows against the decode step above (what a draft costs the target).
if [ -n "${QUICK:-}" ]; then
  verify_shape="smollm2-135m Q4_1"
else
  verify_shape="llama-8b Q4_0"
fi
read -r shape ty <<<"$verify_shape"
for rows in 4 8; do
  part "bench-$shape-$ty-verify$rows" "$SHADERLM" bench --synthetic "$shape" --synthetic-type "$ty" -p 0 -n 8 -r 1 \
    --profile --profile-rows "$rows"
done
# Speculative decoding against plain decoding in the same run, the model drafting for itself (every draft
# accepted): a chain of 7 drafted and verified in one submission, and a (6,10,60) tree grown, reranked and
# verified in one submission.
if [ -n "${QUICK:-}" ]; then
  spec_shape="smollm2-135m Q4_1 30"
else
  spec_shape="llama-1b Q4_0 16"
fi
read -r shape ty layers <<<"$spec_shape"
for draft in "chain7 --draft-max 7" "tree6-10-60 --spec-tree 6,10,60"; do
  read -r label flag value <<<"$draft"
  part "spec-$shape-$ty-$label" "$SHADERLM" bench --synthetic "$shape" --synthetic-type "$ty" --draft-layers "$layers" \
    "$flag" "$value" -n 64 -r 1 --spec-min-accepted 0
done
if [ -z "${QUICK:-}" ]; then
  # Attention decode and the per-op profile at a 4K context, for the 8B shape.
  part "bench-llama-8b-Q4_0-d4096" "$SHADERLM" bench --synthetic llama-8b --synthetic-type Q4_0 -p 0 -n 32 -r 2 --ctx 8192 \
    -d 4096 --profile
fi
part op-tests "$OPS_TEST" --test-threads "$(nproc)"
if [ -n "${QUICK:-}" ]; then
  part op-benches "$OPS_BENCH" read_sum "gemv Q4_0 tiled 576" "attention_decode smollm2"
else
  part op-benches "$OPS_BENCH" read_sum "gemv Q4_0" "gemv Q4_K" "gemv cold" gemm attention_decode attention_prefill "matmul_q rows" \
    kv_move tree_accept tree_frontier tree_select kv_compress block_score block_topk attention_sparse
fi

echo "== written to $out/"
if [ ${#failed[@]} -gt 0 ]; then
  echo "failed or timed out: ${failed[*]}" >&2
  exit 1
fi
