#!/usr/bin/env bash
# Installs what is missing, builds, shows what Nereus plans for real models, moves real
# bytes between processes, and runs PPO on CPUs while the live controller changes the
# job's plan. Writes its files under build/demo/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build -Dtest_set=release  # the tree scripts/test.sh uses too
nereus=build/src/nereus
out=build/demo
mkdir -p "$out"

say() { printf '\n== %s\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

say "Reshard llama-3.1-8b from tp=8 to tp=2,dp=4 on one 8-GPU node, letting the planner place the new ranks" \
  $nereus plan --model llama-3.1-8b --from tp=8,pp=1,dp=1 --to tp=2,pp=1,dp=4 --optimize-placement
say "Back to tp=8: with the right placement nothing moves" \
  $nereus plan --model llama-3.1-8b --from tp=2,pp=1,dp=4 --to tp=8,pp=1,dp=1 --optimize-placement
say "Weight sync of a training actor (tp=4,pp=2) into 8 generation replicas (tp=1) on other GPUs" \
  $nereus plan --model qwen3-8b --sync --from tp=4,pp=2,dp=1 --to tp=1,pp=1,dp=8,devices=8-15
say "llama-3.3-70b with optimizer state on 1,024 GPUs: tp=8,pp=2,dp=64 -> tp=4,pp=4,dp=64" \
  $nereus plan --model llama-3.3-70b --train --from tp=8,pp=2,dp=64 --to tp=4,pp=4,dp=64 --optimize-placement
say "The 4-model llama-3.1-8b PPO job growing from 512 to 1,024 GPUs at 80 GiB per GPU, as one transition graph" \
  $nereus plan --job ppo-llama-3.1-8b --from-plan examples/plans/ppo-8b-512gpus.json --to-plan examples/plans/ppo-8b-1024gpus.json --capacity 80GiB
say "Real bytes across 2 processes over UCX: qwen2.5-0.5b from tp=2 to pp=2, every byte verified" \
  $nereus bench transition --model qwen2.5-0.5b --from tp=2,pp=1,dp=1 --to tp=1,pp=2,dp=1 --transport ucx --procs 2 --verify

# The product at work: PPO on Nereus units (tiny llama models, 8 host devices of 12.6 MiB).
# Responses grow every step (--grow-at -1), so the KV cache outgrows the first plan by the
# third step; the live controller changes the plan beside the running stages, and
# --check-state compares every byte of the training state across the change.
say "PPO on CPUs while the live controller changes the plan (6 steps)" \
  env PYTHONPATH=build/python NEREUS_LOG=info /usr/bin/python3 examples/rlhf/ppo.py --steps 6 --grow-at -1 \
  --check-state --perfetto "$out/ppo-trace.json"
/usr/bin/python3 benches/trace_svg.py "$out/ppo-trace.json" "$out/ppo-trace.svg" \
  --title "ppo.py: stages per device, and the plan change beside them"
printf '\nPerfetto trace: %s (open it in ui.perfetto.dev)\nTrace picture:  %s\n' "$out/ppo-trace.json" "$out/ppo-trace.svg"
