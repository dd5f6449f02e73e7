#!/usr/bin/env bash
# vLLM's scheduler-level tests, three ways: stock, and with pypto_sched's scheduler under
# each policy (swap_scheduler.py), then compare.py judges the three JUnit reports.
#   run_vllm_tests.sh PYTHON WORK   (WORK holds tests/ from the sdist and the HF cache hf/)
set -euo pipefail
python="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"  # (a venv's python: no realpath)
work=$(realpath "$2")
here=$(cd "$(dirname "$0")" && pwd)
export HF_HOME="$work/hf" HF_HUB_OFFLINE=1 VLLM_TARGET_DEVICE=cpu
export PYTHONPATH="$here"
files=(
  tests/v1/core/test_scheduler.py
  tests/v1/core/test_async_scheduler.py
  tests/v1/core/test_priority_preemption_bug.py
  tests/v1/core/test_priority_scheduler_random.py
  tests/v1/core/test_deferred_block_free.py
  tests/v1/core/test_prefix_replay.py
  tests/v1/core/test_swa_inflight_window_free.py
  tests/v1/core/test_worker_slot_overflow.py
)
cd "$work"
# An empty config here, so that pytest does not take this repository's (its strict markers
# and warnings-as-errors) when WORK lies inside it.
printf '[pytest]\n' > "$work/pytest.ini"
# The three runs at once: they share nothing, and two cores finish them in about two thirds
# of the time one after another takes.
declare -A pids starts
for run in stock packed round_robin; do
  option=()
  [ "$run" != stock ] && option=(--pypto-sched-policy="$run")
  starts[$run]=$(date +%s)
  "$python" -m pytest "${files[@]}" -q -p no:cacheprovider -p swap_scheduler "${option[@]}" \
    -W ignore --junitxml="$work/$run.xml" > "$work/$run.log" 2>&1 &
  pids[$run]=$!
done
reports=()
broken=0
for run in stock packed round_robin; do
  # Failures are the point of the comparison, not of this step: compare.py judges them.
  # (Exit 1 is "some tests failed"; anything else is a broken run.)
  status=0
  wait "${pids[$run]}" || status=$?
  echo "$run: $(tail -n 1 "$work/$run.log") ($(( $(date +%s) - starts[$run] )) s)"
  if [ "$status" -gt 1 ] || [ ! -s "$work/$run.xml" ]; then
    tail -n 40 "$work/$run.log"
    broken=1
  fi
  [ "$run" = stock ] || reports+=("$run=$work/$run.xml")
done
[ "$broken" = 0 ] || exit 2
"$python" "$here/compare.py" "$work/stock.xml" "${reports[@]}"
