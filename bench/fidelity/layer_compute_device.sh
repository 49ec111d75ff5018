#!/usr/bin/env bash
# Per-layer compute on a lent GPU, the library calls measured too (OptCNN Table 4, issue 13).
# Run from the repository root on the GPU machine:
#   OUT=/tmp/lc bash bench/fidelity/layer_compute_device.sh [MODEL ...]   (default gpt2_124m resnet50)
# Writes, per model, $OUT/MODEL.json (bench/fidelity/layer_compute.py's results, with the measured calls
# under "contractions") and $OUT/MODEL.hlo.gz (the compiled step). Then, here:
#   python bench/fidelity/layer_compute.py --merge OUT/*.json --json ... --md ... [--before OLD.json]
set -uo pipefail
OUT=${OUT:-/tmp/layer_compute}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
# kernels inside a CUDA graph carry no HLO op name, so the in-step profile could not attribute them
export XLA_FLAGS=--xla_gpu_enable_command_buffer=
CAL=bench/fidelity/results/calibration_h100.json
kind=$(python3 -c 'import jax; print(jax.devices()[0].device_kind)')
echo "device: $kind; jax $(python3 -c 'import jax; print(jax.__version__)')"
if ! grep -q "\"device_kind\": \"$kind\"" "$CAL"; then
  echo "the committed calibration is for another device kind: calibrating this one"
  python3 -m jaxpar calibrate --out "$OUT/calibration.json" | tail -3
  CAL=$OUT/calibration.json
fi
models=("$@")
[ ${#models[@]} -eq 0 ] && models=(gpt2_124m resnet50)
for model in "${models[@]}"; do
  timeout "${BUDGET_S:-280}" python3 bench/fidelity/layer_compute.py --models "$model" \
    --calibration "$CAL" --datasheet dgx-h100 --measure-contractions --hlo-dir "$OUT" \
    --json "$OUT/$model.json" 2>&1 | grep -v "^W0000\|^I0000\|DeprecationWarning\|return {k: v"
done
