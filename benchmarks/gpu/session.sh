#!/bin/bash
# The GPU rows of the speed figures, on a lent GPU machine that reaches no package index.
#
#   benchmarks/gpu/session.sh prepare   # here: EnvPool (Atari, MuJoCo, classic control
#                                       # only), gymnasium, ale-py, MuJoCo, pytest,
#                                       # PettingZoo, MPE and PufferLib as cp312 wheels, unpacked
#                                       # into .gpu/site.tgz (~35 MB)
#   benchmarks/gpu/session.sh run [STEP...]   # there (carry .gpu): writes $OUT/*.json,
#                                       # a log; steps: splits pong tests chunks mpe
#                                       # mpe_peers async
#                                       # (default: splits pong)
#
# The machine's image brings Python 3.12, JAX with CUDA, flax, chex, torch and OpenCV.
# Three JAX processes share the GPU (jaxrunner, the hand loops, the peers), so XLA's
# preallocation is off. Each step has its own timeout; what ran comes back.
set -u
cd "$(dirname "$0")/../.."
case "${1:-}" in
prepare)
  grep -qx "/.gpu/" .git/info/exclude 2>/dev/null || echo "/.gpu/" >>.git/info/exclude
  tmp=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 \
    --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$tmp/whl" gymnasium==1.4.0 farama-notifications \
    ale-py==0.12.1 envpool==1.2.5 envpool-assets==0.3.0 dm-env optree dm-tree \
    types-protobuf glfw mujoco==3.3.7 pyopengl pytest pluggy iniconfig pettingzoo==1.27.0 \
    mpe2==1.1.1 pygame-ce==2.5.8 pufferlib-core==3.0.23 || exit 1
  mkdir -p "$tmp/site" .gpu
  for w in "$tmp"/whl/*.whl; do unzip -q -o "$w" -d "$tmp/site"; done
  # EnvPool's other env families are 100+ MB: keep Atari, MuJoCo gym, classic control.
  (cd "$tmp/site/envpool" && rm -rf gfootball vizdoom box2d procgen jumanji minigrid pgx \
    highway toy_text mujoco/{dmc,metaworld,myosuite,playground,robotics} \
    mujoco/{playground,mujoco_dmc,myosuite,robotics}_envpool.so &&
    sed -i -E '/^import envpool\./{/envpool\.(atari|classic_control|mujoco\.gym)\./!d}' entry.py)
  (cd "$tmp/site/envpool_assets" && rm -rf gfootball procgen vizdoom mujoco/metaworld \
    mujoco/assets_dmc mujoco/robotics && find atari/roms -type f ! -name pong.bin -delete)
  tar czf .gpu/site.tgz -C "$tmp" site && rm -rf "$tmp" && ls -la .gpu/site.tgz
  ;;
run)
  exec > >(tee -a "$OUT/gpu_log.txt") 2>&1
  tar xzf .gpu/site.tgz -C /tmp || exit 1
  export PYTHONPATH=/tmp/site:$PWD XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
  py=$(command -v python3)
  nproc; nvidia-smi -L
  python3 -c "import jax, flax, envpool; print(jax.__version__, flax.__version__, jax.devices())" || exit 2
  step() { local limit=$1; shift; local t0=$SECONDS; timeout "$limit" "$@"; echo "rc=$? $((SECONDS - t0)) s: $*"; }
  steps=("${@:2}")
  [ ${#steps[@]} -eq 0 ] && steps=(splits pong)
  for name in "${steps[@]}"; do
    case "$name" in
    splits)
      step 80 python3 benchmarks/splits.py --workload cartpole --widths 8 256 --rounds 3 --out "$OUT/splits_cartpole_gpu.json"
      step 80 python3 benchmarks/splits.py --workload halfcheetah --widths 8 32 --rounds 3 --out "$OUT/splits_halfcheetah_gpu.json"
      step 60 python3 benchmarks/splits.py --workload halfcheetah --backend process --widths 8 32 --rounds 3 --out "$OUT/splits_halfcheetah_process_gpu.json" ;;
    pong)
      # Pong's envpool row comes last at each width: 32 envs in a run of its own, so a
      # time-out at 32 keeps the whole of 8.
      step 130 python3 benchmarks/peers.py --workload pong --widths 8 --peers-python "$py" --no-rllib --rounds 3 --seconds 1 --out "$OUT/peers_pong8_gpu.json"
      step 160 python3 benchmarks/peers.py --workload pong --widths 32 --peers-python "$py" --no-rllib --rounds 3 --seconds 1 --out "$OUT/peers_pong32_gpu.json" ;;
    tests)  # batch invariance (its one-chunk path), the counted transfers, the policy server,
      # the split rules (they fake each platform in turn)
      step 300 python3 -m pytest -o addopts="" -p no:cacheprovider -q tests/test_batch_invariance.py \
        tests/test_transfers.py tests/test_external.py tests/test_multi_agent_pipeline.py \
        tests/test_envs_process.py -k "not test_envs_process or default_splits" ;;
    chunks)  # one NatureCNN call of 32 rows: plain, in two chunks (a loop), as one chunk
      step 60 python3 benchmarks/chunk_sizes.py --policy nature_cnn --rows 32 --chunks 16 32 --out "$OUT/chunk_sizes_nature_cnn32_one_call_gpu.json" ;;
    mpe)  # the multi-agent row: MPE simple-spread against the PettingZoo hand loop
      step 150 python3 -m jaxrunner bench --env mpe2:simple_spread_v3 --backend sync --num-envs 8 64 --rounds 3 --out "$OUT/bench_mpe_gpu.json"
      step 150 python3 -m jaxrunner bench --env mpe2:simple_spread_v3 --backend process --num-envs 8 64 --rounds 3 --out "$OUT/bench_mpe_process_gpu.json" ;;
    mpe_peers)  # MPE beside PufferLib's PettingZoo emulation (Serial, Multiprocessing) and the hand loop
      step 240 python3 benchmarks/multi_agent.py --part host --widths 8 64 --peers-python "$py" --rounds 3 --seconds 1 --out "$OUT/multi_agent_host_gpu.json" ;;
    async)  # EnvPool's async mode: the two halves gathered into one call, or each acting
      step 200 python3 benchmarks/envpool_reset_steps.py --workload pong --async-mode --per-recv --num-envs 8 32 --rollout-length 32 --reps 2 --rounds 5 --out "$OUT/envpool_per_recv_pong_gpu.json" ;;
    *) echo "unknown step $name (steps: splits pong tests chunks mpe mpe_peers async)" >&2; exit 2 ;;
    esac
  done
  ;;
*) echo "usage: $0 prepare | run [STEP...]" >&2; exit 2 ;;
esac
