#!/usr/bin/env bash
# The CPU study behind configs/ptb.py:fast (results/fast_recipe_cpu/README.md): optimisation
# recipes for a short budget, ranked on a small HyperRHN, the finalists confirmed on the :cpu
# model with two seeds. Two ablations run side by side, each on one core (XLA single-threaded).
#   bash benchmarks/schedule_study.sh small
#   bash benchmarks/schedule_study.sh small2  # the follow-up the first results chose
#   CPU_FINALIST=NAME:FIELD=V,... bash benchmarks/schedule_study.sh cpu
#   bash benchmarks/schedule_study.sh table   # the markdown table of every run
#   bash benchmarks/schedule_study.sh batch   # equal steps at batch 64, 128, 256, peak scaled
#   bash benchmarks/schedule_study.sh cpu_batch  # the :cpu model: batch 64, 128, 256, linear
#   [STUDY=cpubatch] bash benchmarks/schedule_study.sh batch_table PNG  # table and plot
# PTB: $RHHJAX_PTB (default ../shared/data/ptb). Workdirs and tables: $OUT (default
# workdirs/fast_recipe).
set -euo pipefail
cd "$(dirname "$0")/.."
PTB=${RHHJAX_PTB:-../shared/data/ptb}
OUT=${OUT:-workdirs/fast_recipe}
export XLA_FLAGS="--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"
ablate() {  # ablate NAME ARGS...: one ablation of the :cpu config into $OUT/NAME
  local name=$1
  shift
  python -m rhhjax.tools.ablate --config=configs/ptb.py:cpu --config.data.dir="$PTB" \
    --config.train.max_minutes=0 --config.train.patience=0 --memory=false \
    --out="$OUT/$name" "$@"
}
# The small model: main 128, hyper 32, depth 3 (the :cpu model is 256 / 64 / 3); 600 steps
# of batch 64 (0.75 epochs); validation every 100 steps on the first 100,000 valid characters.
SMALL=(--config.model.hidden=128 --config.model.hyper_hidden=32
  --config.train.eval_every_steps=100 --config.eval.final_protocols=)
COS="train.schedule=cosine,train.warmup_steps=30"
case ${1:-} in
  small)
    ablate small_a "${SMALL[@]}" \
      --variant=const_1e-3:train.learning_rate=1e-3,train.max_steps=600 \
      --variant=const_2e-3:train.learning_rate=2e-3,train.max_steps=600 \
      --variant=cos_2e-3:$COS,train.learning_rate=2e-3,train.max_steps=600 \
      --variant=cos_4e-3:$COS,train.learning_rate=4e-3,train.max_steps=600 \
      --variant=cos_8e-3:$COS,train.learning_rate=8e-3,train.max_steps=600 \
      > "$OUT.small_a.log" 2>&1 &
    ablate small_b "${SMALL[@]}" \
      --variant=lin_4e-3:train.schedule=linear,train.warmup_steps=30,train.learning_rate=4e-3,train.max_steps=600 \
      --variant=cos_4e-3_l2:$COS,train.learning_rate=4e-3,train.clip_type=l2,train.clip_norm=1.0,train.max_steps=600 \
      --variant=cos_4e-3_b2-0.99:$COS,train.learning_rate=4e-3,train.b2=0.99,train.max_steps=600 \
      --variant=b128_cos_5.7e-3_300:train.schedule=cosine,train.warmup_steps=15,train.learning_rate=5.7e-3,train.batch_size=128,train.max_steps=300 \
      --variant=b256_cos_8e-3_150:train.schedule=cosine,train.warmup_steps=8,train.learning_rate=8e-3,train.batch_size=256,train.max_steps=150 \
      > "$OUT.small_b.log" 2>&1 &
    wait
    ;;
  small2)  # after `small`: the best peak (8e-3) doubled, and crossed with the L2 clip
    ablate small_c "${SMALL[@]}" \
      --variant=cos_16e-3:$COS,train.learning_rate=16e-3,train.max_steps=600 \
      > "$OUT.small_c.log" 2>&1 &
    ablate small_d "${SMALL[@]}" \
      --variant=cos_8e-3_l2:$COS,train.learning_rate=8e-3,train.clip_type=l2,train.clip_norm=1.0,train.max_steps=600 \
      > "$OUT.small_d.log" 2>&1 &
    wait
    ;;
  cpu)
    FINAL=(--config.train.max_steps=1600 --config.eval.final_protocols=windows)
    ablate cpu_const "${FINAL[@]}" --seeds=0,1 --variant=const_2e-3: > "$OUT.cpu_const.log" 2>&1 &
    ablate cpu_sched "${FINAL[@]}" --seeds=0,1 \
      --variant="${CPU_FINALIST:?set CPU_FINALIST=NAME:FIELD=V,... from the small study}" \
      > "$OUT.cpu_sched.log" 2>&1 &
    wait
    ;;
  batch)  # the small model at equal steps: batch 64 (peak 8e-3), 128 and 256 with the peak
    # scaled by the square root of the batch ratio and linearly; the :fast recipe, seeds 0, 1
    BATCH=(--config.train.max_steps=400 --config.train.schedule=cosine
      --config.train.warmup_steps=20 --config.train.clip_type=l2 --config.train.clip_norm=1.0
      --seeds=0,1 --at_steps=100,200,300,400)
    ablate batch_sqrt "${SMALL[@]}" "${BATCH[@]}" \
      --variant=b64:train.batch_size=64,train.learning_rate=8e-3 \
      --variant=b128_sqrt:train.batch_size=128,train.learning_rate=1.13e-2 \
      --variant=b256_sqrt:train.batch_size=256,train.learning_rate=1.6e-2 \
      > "$OUT.batch_sqrt.log" 2>&1 &
    ablate batch_linear "${SMALL[@]}" "${BATCH[@]}" \
      --variant=b128_linear:train.batch_size=128,train.learning_rate=1.6e-2 \
      --variant=b256_linear:train.batch_size=256,train.learning_rate=3.2e-2 \
      > "$OUT.batch_linear.log" 2>&1 &
    wait
    ;;
  cpu_batch)  # the :cpu model at equal steps: batch 64, 128, 256, the peak scaled linearly
    CPU_BATCH=(--config.train.max_steps=300 --config.train.schedule=cosine
      --config.train.warmup_steps=20 --config.train.clip_type=l2 --config.train.clip_norm=1.0
      --config.train.eval_every_steps=100 --config.eval.final_protocols= --at_steps=100,200,300
      --variant=b64:train.batch_size=64,train.learning_rate=8e-3
      --variant=b128_linear:train.batch_size=128,train.learning_rate=1.6e-2
      --variant=b256_linear:train.batch_size=256,train.learning_rate=3.2e-2)
    ablate cpubatch_s0 "${CPU_BATCH[@]}" --seeds=0 > "$OUT.cpubatch_s0.log" 2>&1 &
    ablate cpubatch_s1 "${CPU_BATCH[@]}" --seeds=1 > "$OUT.cpubatch_s1.log" 2>&1 &
    wait
    ;;
  batch_table)  # a batch study's valid BPC at each step, mean of its seeds, and its plot
    # (STUDY=batch: the small model's; STUDY=cpubatch: the :cpu model's)
    python - "$OUT" "${2:?give the plot file}" "${STUDY:-batch}" << 'PYEOF'
import glob, json, statistics, sys
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
rows = [r for p in sorted(glob.glob(f"{sys.argv[1]}/{sys.argv[3]}_*/results.json"))
        for r in json.load(open(p))["rows"]]
groups = {}
for r in rows:
    groups.setdefault(r["group"], []).append(r)
steps = sorted({s for r in rows for s, _, _ in r["valid_curve"]})
print("| run | batch | peak lr | seeds | " + " | ".join(f"step {s}" for s in steps) + " |")
print("|---|---|---|---|" + "---|" * len(steps))
fig, ax = plt.subplots(figsize=(6, 4))
for name, runs in sorted(groups.items(), key=lambda g: (g[1][0]["overrides"]["train.batch_size"], g[0])):
    mean = [statistics.mean(dict((s, b) for s, _, b in r["valid_curve"])[s] for r in runs) for s in steps]
    over = runs[0]["overrides"]
    print(f"| {name} | {over['train.batch_size']} | {over['train.learning_rate']:g} | "
          f"{len(runs)} | " + " | ".join(f"{m:.4f}" for m in mean) + " |")
    ax.plot(steps, mean, "o-", label=f"{name} (peak {over['train.learning_rate']:g})")
ax.set_xlabel("step"); ax.set_ylabel("valid BPC (first 100,000 characters)")
ax.grid(True, alpha=0.3); ax.legend(fontsize=8); fig.tight_layout(); fig.savefig(sys.argv[2], dpi=120)
PYEOF
    ;;
  table)  # one markdown table of every run in $OUT/*/results.json
    python - "$OUT" << 'PYEOF'
import glob, json, sys
print("| ablation | run | batch | steps | epochs | schedule | peak lr | clip | b2 | best valid BPC "
      "(step) | whole valid | s / step | training min |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for path in sorted(glob.glob(f"{sys.argv[1]}/*/results.json")):
    for r in json.load(open(path))["rows"]:
        cfg = json.load(open(f"{r['workdir']}/config.json"))["train"]
        whole = r["final"].get("valid_windows")
        whole = "-" if whole is None else f"{whole:.4f}"
        schedule = cfg["schedule"] + (f", warm-up {cfg['warmup_steps']}" if cfg["schedule"] != "constant" else "")
        print(f"| {path.split('/')[-2]} | {r['variant']} | {cfg['batch_size']} | {r['steps']} | "
              f"{r['epochs']:.2f} | {schedule} | {cfg['learning_rate']:g} | "
              f"{cfg['clip_type'].upper()} {cfg['clip_norm']:g} | {cfg['b2']:g} | "
              f"{r['best_valid_bpc']:.4f} ({r['best_step']}) | {whole} | {r['step_s']:.3f} | "
              f"{r['train_minutes']:.1f} |")
PYEOF
    ;;
  *)
    echo "usage: bash benchmarks/schedule_study.sh small|small2|cpu|batch|cpu_batch|batch_table PNG|table" >&2
    exit 2
    ;;
esac
