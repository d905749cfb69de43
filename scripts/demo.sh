#!/usr/bin/env bash
# Installs what is missing, builds, and shows what Nereus plans for real models.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
bash scripts/build.sh build
nereus=build/src/nereus

say() { printf '\n== %s\n$ %s\n' "$1" "${*:2}"; "${@:2}"; }

say "Reshard llama-3.1-8b from tp=8 to tp=2,dp=4 on one 8-GPU node, in device order" \
  $nereus plan --model llama-3.1-8b --from tp=8,pp=1,dp=1 --to tp=2,pp=1,dp=4
say "The same, letting the planner choose which GPU takes which position" \
  $nereus plan --model llama-3.1-8b --from tp=8,pp=1,dp=1 --to tp=2,pp=1,dp=4 --optimize-placement
say "Back to tp=8: with the right placement nothing moves" \
  $nereus plan --model llama-3.1-8b --from tp=2,pp=1,dp=4 --to tp=8,pp=1,dp=1 --optimize-placement
say "Weight sync of a training actor (tp=4,pp=2) into 8 generation replicas (tp=1) on other GPUs" \
  $nereus plan --model qwen3-8b --sync --from tp=4,pp=2,dp=1 --to tp=1,pp=1,dp=8,devices=8-15
say "llama-3.3-70b with optimizer state on 1,024 GPUs: tp=8,pp=2,dp=64 -> tp=4,pp=4,dp=64" \
  $nereus plan --model llama-3.3-70b --train --from tp=8,pp=2,dp=64 --to tp=4,pp=4,dp=64 --optimize-placement
say "Move real bytes: llama-3.2-1b tp=4 -> tp=2,dp=2 on 4 host devices, every byte verified" \
  $nereus bench transition --model llama-3.2-1b --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --verify
say "The same across 2 processes over UCX" \
  $nereus bench transition --model llama-3.2-1b --from tp=4,pp=1,dp=1 --to tp=2,pp=1,dp=2 --transport ucx --procs 2 --verify
say "A whole PPO job's plan change as one transition graph (7 model-stages, tiny models)" \
  $nereus plan --job ppo-tiny --from-plan examples/plans/ppo-tiny-a.json --to-plan examples/plans/ppo-tiny-b.json --nodes
say "The 4-model llama-3.1-8b PPO job growing from 512 to 1,024 GPUs at 80 GiB per GPU" \
  $nereus plan --job ppo-llama-3.1-8b --from-plan examples/plans/ppo-8b-512gpus.json --to-plan examples/plans/ppo-8b-1024gpus.json --capacity 80GiB
say "Coordinated plan changes of two model-stages on a nearly full pool, real bytes, random timing" \
  $nereus bench coordination --type cm-cs --trials 10
