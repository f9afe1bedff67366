#!/bin/bash
# Hot update against restart_all (issue 16), on the tiny 3-D job (TP2×PP2×DP2, keel-launch on 4
# local slots of 2 workers and a standby), each run ROUNDS times, best of each:
#   update     keel-ctl update to another build of the same model (build/bin/libkeel_gpt_proxy.so)
#              mid-run: time from the request to every rank switched, and to the first step
#              on the new code (the switch plus one step);
#   rollback   keel-ctl update to a build that crashes in its 4th forward call: time from the
#              failure's detection to the first step after the rollback (plugin and state);
#   restart    recovery.mode restart_all from a persistent checkpoint after a crash: detection
#              to the first step (the baseline: a requeue of every process).
# The processes of each run are counted from the report's ranks[].pids.
#   bench/bench_hot_update.sh [rounds=3] [build=build]
set -euo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
build=${2:-build}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=${TMPDIR:-/tmp}/keel-bench-hot-update
rm -rf "$out"
mkdir -p "$out"
scripts/make-demo-data.sh data/demo > /dev/null
common=(--local 5 --standby 1 --workers-per-slot 2 --config examples/configs/tiny-gpt-3d.pbtxt
  --set train.steps=600 --set train.eval_every=0 --set train.log_every=1000 --quiet)

# Starts the job, waits until it has done 100 steps, runs keel-ctl "$@", waits for the end.
run_with_ctl() {
  local tag=$1
  shift
  "$build/bin/keel-launch" "${common[@]}" --run-dir "$out/runs-$tag" --report "$out/$tag.json" \
    > "$out/$tag.log" 2>&1 &
  local pid=$!
  local job=""
  for _ in $(seq 600); do
    job=$(ls -d "$out/runs-$tag"/*/ 2> /dev/null | head -1 || true)
    if [ -n "$job" ] && [ -e "$job/controller" ]; then
      step=$("$build/bin/keel-ctl" status --run "$job" 2> /dev/null |
        sed -n 's/.*| step \([0-9]*\) |.*/\1/p' | head -1)
      [ -n "$step" ] && [ "$step" -ge 100 ] && break
    fi
    sleep 0.05
  done
  "$build/bin/keel-ctl" "$@" --run "$job" >> "$out/$tag.ctl" 2>&1
  wait "$pid"
}

for r in $(seq "$rounds"); do
  run_with_ctl "update-$r" update --plugin "$build/bin/libkeel_gpt_proxy.so"
  run_with_ctl "rollback-$r" update --plugin "$build/bin/libkeel_gpt_crashing.so"
  "$build/bin/keel-launch" "${common[@]}" --run-dir "$out/runs-restart-$r" \
    --set recovery.mode=restart_all --set checkpoint.persistent_every_steps=50 \
    --set checkpoint.dir="$out/ckpt-$r" --fault crash@step=300,rank=5 \
    --report "$out/restart-$r.json" > "$out/restart-$r.log" 2>&1
done

python3 - "$out" "$rounds" << 'EOF'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def load(tag):
    return [json.load(open(f"{out}/{tag}-{r}.json")) for r in range(1, rounds + 1)]
def procs(rep):
    return sum(len(r.get("pids", [])) for r in rep.get("ranks", []))
rows = []
for rep in load("update"):
    u = rep["updates"][0]
    step_s = 1.0 / rep["tokens_per_s"] * 16 * 64 if rep.get("tokens_per_s") else 0
    rows.append(("update", u["outcome"], u["applied_at"] - u["requested_at"],
                 u["applied_at"] - u["requested_at"] + step_s, procs(rep), rep["param_checksum"]))
best_u = min(rows, key=lambda r: r[3])
rb = []
for rep in load("rollback"):
    inc = [i for i in rep["incidents"] if i["kind"] == "rollback"][0]
    rb.append((rep["updates"][0]["outcome"], inc["first_step_at"] - inc["detected_at"],
               inc["restored_step"], procs(rep), rep["param_checksum"]))
best_rb = min(rb, key=lambda r: r[1])
rs = []
for rep in load("restart"):
    inc = rep["incidents"][0]
    rs.append((inc["first_step_at"] - inc["detected_at"], inc["restored_step"], procs(rep),
               rep["param_checksum"]))
best_rs = min(rs, key=lambda r: r[0])
print(f"tiny 3-D, TP2xPP2xDP2 on 4 slots + 1 standby, 600 steps; best of {rounds}")
print(f"  update to another build   {best_u[1]:>11}: request -> every rank switched {best_u[2]*1e3:7.1f} ms, "
      f"-> first step on the new code {best_u[3]*1e3:7.1f} ms; {best_u[4]} worker processes for 8 ranks")
print(f"  update that crashes       {best_rb[0]:>11}: failure detected -> first step after rollback "
      f"{best_rb[1]*1e3:7.1f} ms (restored step {best_rb[2]}); {best_rb[3]} worker processes")
print(f"  restart_all (baseline)    {'crash':>11}: failure detected -> first step {best_rs[0]*1e3:7.1f} ms "
      f"(restored step {best_rs[1]}); {best_rs[2]} worker processes")
print(f"  rollback / restart_all = {best_rb[1] / best_rs[0]:.2f}; update / restart_all = {best_u[3] / best_rs[0]:.2f}")
print("  all runs bitwise equal:", len({r[5] for r in rows} | {r[4] for r in rb} | {r[3] for r in rs}) == 1)
EOF
