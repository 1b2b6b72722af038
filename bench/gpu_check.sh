#!/usr/bin/env bash
# The GPU check: run the CUDA tests, then time every mode on a synthetic products-like graph on the GPU.
#
#   bash bench/gpu_check.sh                 # uses python3 from PATH (a PyTorch build with CUDA)
#   PYTHON=/path/to/python bash bench/gpu_check.sh
#
# Installs nothing. Prints its progress; writes everything it prints, the summaries and a markdown table
# to $RESULTS (default docs/results/gpu-<date>-<gpu name>/). It took 4.0-4.5 minutes on one H200 (2026-11-30),
# before the bf16 runs were added (about a minute more).
#
# Graph: 2.4M vertices, about 62M edges (degree 26), 100-dim features, 47 classes (the size of
# ogbn-products). Model: 3-layer SAGE, fanouts 15,10,5, hidden 256, batch 1024; modes exact, device and
# neutronorch at their defaults; EPOCHS epochs each (default 3; the first is excluded from the median),
# once with the features free to fill the GPU and once with the device feature cache capped to 25% of the
# features (--gpu-cache-gb), the regime NeutronOrch is made for, and once more with every row on the GPU in
# bfloat16 (--precision bf16). bench/gpu_table.py prints the table and checks the targets.
#
# Then the profiles of device mode (bench/device_profile.py --compare: the torch and Triton samplers'
# launches and host synchronisations per mini-batch; bench/feature_bandwidth.py: feature reads against the
# bus's peak), into $RESULTS/device_profile.txt and feature_bandwidth.{txt,json}.
#
# Then the regime benchmark (bench/regime.py; REGIME=0 skips it): every mode on a graph whose features are
# twice the GPU budget (8M vertices, 512 features: 16 GB, --gpu-memory-gb 8) and on the graph above as the
# control, in at most REGIME_BUDGET seconds (default 480, generation included); its table and summaries go
# to $RESULTS/regime/. REGIME_MODES (regime.py's --modes) and REGIME_BOTTOM_HEAVY (its --bottom-heavy; set
# and empty: no second group) narrow it, as the CPU rehearsal in the tests does.
#
# Rehearsal without a GPU (the same steps with --device cpu, no cuda tests, a small graph, results under
# /tmp unless RESULTS is set; the regime step with NODES vertices and 64 features):
# DEVICE=cpu NODES=20000 bash bench/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
EPOCHS=${EPOCHS:-3}
DEVICE=${DEVICE:-cuda}
NODES=${NODES:-2400000}
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"

# One interpreter start (importing torch takes seconds): the device's name, the versions, the device count.
if ! probe=$("$PYTHON" -c "import sys, torch; cuda = torch.cuda.is_available()
print(torch.cuda.get_device_name(0) if cuda else 'none')
print(sys.version.split()[0], 'torch', torch.__version__)
print(torch.cuda.device_count())"); then
    echo "gpu_check: $PYTHON cannot import torch; set PYTHON to an interpreter with a CUDA build of PyTorch" >&2
    exit 2
fi
gpu=$(sed -n 1p <<< "$probe")
versions=$(sed -n 2p <<< "$probe")
gpus=$(sed -n 3p <<< "$probe")
stamp=$(date -u +%Y-%m-%d)
if [ "$DEVICE" = cpu ]; then
    gpu="none (rehearsal on the CPU)"
    RESULTS=${RESULTS:-/tmp/neutronorch-gpu-check-rehearsal}
elif [ "$gpu" = "none" ]; then
    echo "gpu_check: torch sees no CUDA device; nothing to check (DEVICE=cpu rehearses the steps)" >&2
    exit 2
fi
slug=$(echo "$gpu" | tr -cs 'A-Za-z0-9' '-' | sed 's/-$//')
RESULTS=${RESULTS:-docs/results/gpu-$stamp-$slug}
mkdir -p "$RESULTS"
log="$RESULTS/log.txt"
say() { echo "[gpu_check $(date -u +%H:%M:%S)] $*" | tee -a "$log" >&2; }

say "GPU: $gpu; python: $versions"
if [ "$DEVICE" = cuda ]; then
    say "1/4 cuda tests"
    timeout "${TEST_LIMIT:-150}" "$PYTHON" -m pytest -q -m cuda tests/ 2>&1 | tee -a "$log" | tail -15
    say "cuda tests exit status ${PIPESTATUS[0]}"
else
    say "1/4 cuda tests: skipped (DEVICE=$DEVICE)"
fi

data=${GRAPH_DIR:-/tmp/neutronorch-products-like-$NODES}
if [ ! -f "$data/meta.json" ]; then
    say "2/4 generating the products-like graph ($NODES vertices) into $data"
    "$PYTHON" -m neutronorch generate synthetic --nodes "$NODES" --degree 26 --features 100 --classes 47 \
        --out "$data" 2>&1 | tee -a "$log"
else
    say "2/4 graph already at $data"
fi

say "3/4 modes on $DEVICE ($EPOCHS epochs each; features on the device, then capped to 25%, then bf16)"
quarter=$("$PYTHON" -c "import json,sys; m=json.load(open(sys.argv[1])); print(f\"{0.25 * m['num_nodes'] * m['feature_dim'] * 4 / 2**30:.4f}\")" "$data/meta.json")
for cap in full quarter bf16; do
    for mode in exact device neutronorch; do
        limit=()
        [ "$cap" = quarter ] && limit=(--gpu-cache-gb "$quarter")
        [ "$cap" = bf16 ] && limit=(--precision bf16)
        say "mode $mode, features $cap ${limit[*]}"
        timeout "${RUN_LIMIT:-60}" "$PYTHON" -m neutronorch train --dataset "$data" --device "$DEVICE" --mode "$mode" \
            --model sage --fanouts 15,10,5 --hidden 256 --batch-size 1024 --dropout 0.5 --epochs "$EPOCHS" \
            --eval-every 0 --eval-fanouts 15,10,5 --eval-max-nodes 50000 --no-progress --overwrite "${limit[@]}" \
            --summary-json "$RESULTS/$mode-$cap.json" 2>&1 | tee -a "$log" | tail -8
        say "mode $mode, features $cap: exit status ${PIPESTATUS[0]}"
    done
done

if [ "$DEVICE" = cuda ] && [ "$gpus" -gt 1 ]; then
    for mode in exact neutronorch; do  # neutronorch: shared hot rows computed once per node (--hot-set node)
        say "data parallel: $gpus ranks (NCCL), $mode mode, batch 1024 per rank"
        timeout "${RUN_LIMIT:-60}" "$PYTHON" -m torch.distributed.run --standalone --nproc-per-node "$gpus" \
            -m neutronorch train --dataset "$data" --device cuda --mode "$mode" --model sage --fanouts 15,10,5 \
            --hidden 256 --batch-size 1024 --dropout 0.5 --epochs "$EPOCHS" --eval-every 0 --eval-fanouts 15,10,5 \
            --eval-max-nodes 50000 --no-progress --overwrite $([ "$mode" = neutronorch ] && echo --hot-set node) \
            --summary-json "$RESULTS/$mode-ddp$gpus.json" 2>&1 | tee -a "$log" \
            | tail -8
        say "data parallel, $mode mode: exit status ${PIPESTATUS[0]}"
    done
else
    say "data parallel: skipped ($gpus GPU)"
fi

"$PYTHON" bench/gpu_table.py "$RESULTS" "$gpu" | tee "$RESULTS/table.md"

# Where device mode's time goes: launches and host synchronisations per mini-batch of the torch and Triton
# samplers side by side, the training step, and the feature reads against the bus's peak.
say "profiles: device_profile.py --compare, feature_bandwidth.py"
timeout "${PROFILE_LIMIT:-120}" "$PYTHON" bench/device_profile.py --dataset "$data" --device "$DEVICE" --compare \
    --batches "${PROFILE_BATCHES:-10}" 2>&1 | tee "$RESULTS/device_profile.txt" | tee -a "$log" | head -40
say "device_profile exit status ${PIPESTATUS[0]}"
timeout "${PROFILE_LIMIT:-120}" "$PYTHON" bench/feature_bandwidth.py --dataset "$data" --device "$DEVICE" \
    --batches "${PROFILE_BATCHES:-10}" --json "$RESULTS/feature_bandwidth.json" 2>&1 \
    | tee "$RESULTS/feature_bandwidth.txt" | tee -a "$log"
say "feature_bandwidth exit status ${PIPESTATUS[0]}"

if [ "${REGIME:-1}" != 0 ]; then
    # The products-like graph above is the control; the regime graph is generated (or found) next to it.
    regime=(--device "$DEVICE" --epochs "$EPOCHS" --budget-s "${REGIME_BUDGET:-480}" --out "$RESULTS/regime"
            --control-graph "$data" --control-nodes "$NODES" --graph-root "$(dirname "$data")")
    [ "$DEVICE" = cpu ] && regime+=(--nodes "$NODES" --features 64 --batch-size 256)
    [ -n "${REGIME_MODES:-}" ] && regime+=(--modes "$REGIME_MODES")
    [ -n "${REGIME_BOTTOM_HEAVY+set}" ] && regime+=(--bottom-heavy "$REGIME_BOTTOM_HEAVY")
    say "4/4 the regime benchmark: features twice the GPU budget, every mode (at most ${REGIME_BUDGET:-480} s)"
    "$PYTHON" bench/regime.py "${regime[@]}" 2>&1 | tee -a "$log"
    say "the regime benchmark returned ${PIPESTATUS[0]}"
else
    say "4/4 the regime benchmark: skipped (REGIME=0)"
fi
say "done; results in $RESULTS"
