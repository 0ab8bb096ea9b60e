#!/usr/bin/env bash
# Regenerate traces/recorded/: small traces recorded from vLLM's real scheduler.
# Usage: scripts/make_corpus.sh [SIMRIG]   (default .venv/bin/simrig, else python -m simrig)
set -euo pipefail
cd "$(dirname "$0")/.."
SIMRIG=${1:-}
if [[ -z "$SIMRIG" ]]; then
  if [[ -x .venv/bin/simrig ]]; then SIMRIG=.venv/bin/simrig; else SIMRIG="python -m simrig"; fi
fi
OUT=traces/recorded
mkdir -p "$OUT"
rec() { local name=$1; shift; echo "== $name"; $SIMRIG record --out "$OUT/$name.jsonl.gz" "$@"; }

# many short requests arriving and finishing: slot reuse, finish + add in one step
rec churn --workload "synthetic:requests=80,rate=400,prompt=4-48,output=1-12" \
  --max-num-seqs 16 --max-num-batched-tokens 256 --num-kv-blocks 256 --eos-prob 0.05 --steps 120 --seed 1
# long prompts under a small token budget: chunked prefill, decodes mixed with chunks
rec chunked --workload "synthetic:requests=12,rate=20,prompt=200-900,output=4-24" \
  --max-num-seqs 8 --max-num-batched-tokens 128 --max-model-len 1024 --steps 120 --seed 2
# a KV cache too small for the batch: preemption, then resumption as a new request
rec preempt --workload "synthetic:requests=16,rate=100,prompt=32-128,output=40-120" \
  --max-num-seqs 8 --max-num-batched-tokens 128 --max-model-len 512 --num-kv-blocks 36 --steps 150 --seed 3
# speculative decoding: 3 drafts per step, half of them rejected
rec specdecode --workload "synthetic:requests=16,rate=40,prompt=16-96,output=16-64" \
  --max-num-seqs 8 --max-num-batched-tokens 128 --num-speculative-tokens 3 --acceptance-rate 0.5 --steps 120 --seed 4
# shared prefixes: prefix-cache hits, new requests with num_computed_tokens > 0
rec prefix --workload "synthetic:requests=24,rate=30,prompt=80-200,output=4-24,shared_prefix=0.8,prefixes=3,prefix_len=64" \
  --max-num-seqs 8 --max-num-batched-tokens 256 --steps 120 --seed 5
# a PCP-sized config (2 ranks) with chunking, preemption and drafts
rec pcp2 --workload "synthetic:requests=20,rate=60,prompt=16-300,output=8-48,shared_prefix=0.3" \
  --max-num-seqs 8 --max-num-batched-tokens 128 --max-model-len 512 --num-kv-blocks 40 \
  --num-speculative-tokens 2 --pcp-size 2 --steps 120 --seed 6
# everything at once
rec mixed --workload "synthetic:requests=24,rate=50,prompt=16-160,output=4-40,shared_prefix=0.3,prefix_len=48" \
  --max-num-seqs 8 --max-num-batched-tokens 128 --max-model-len 512 --num-kv-blocks 40 \
  --num-speculative-tokens 2 --acceptance-rate 0.6 --eos-prob 0.02 --steps 200 --seed 1
du -ch "$OUT"/*.jsonl.gz | tail -1
