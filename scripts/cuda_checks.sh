#!/usr/bin/env bash
# The CUDA paths, run on a machine with an NVIDIA GPU (CI has none, so they are checked by hand):
#   1. the provider probe (does onnxruntime load CUDA here, and if not, why),
#   2. the data-plane, gateway and sim-vs-live tests with every "auto" session on CUDA,
#   3. the data-plane benchmark on CUDA and on CPU (same machine, same run),
#   4. a quick profile table measured on CUDA (the table the simulator reads).
# Usage: scripts/cuda_checks.sh OUTDIR   (PYTHON=... picks the interpreter; logs and tables land in OUTDIR)
# Run from the repository root with edgepop and its test extra installed (pip install -e ".[test]") on a machine
# where onnxruntime-gpu finds its CUDA libraries; it stops after the probe if CUDA does not load.
set -u
out=${1:?usage: scripts/cuda_checks.sh OUTDIR}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 MPLBACKEND=Agg

{
  nvidia-smi -L 2>&1 | head -4
  "$py" - <<'EOF'
import subprocess, sys
import onnxruntime as ort
from dataplane import session
print("onnxruntime", ort.__version__, ort.get_available_providers())
print("cuda_available", session.cuda_available())
if not session.cuda_available():
    p = subprocess.run([sys.executable, "-c", session._PROBE], capture_output=True, text=True)
    print("probe stdout:", p.stdout[-2000:])
    print("probe stderr:", p.stderr[-4000:])
EOF
} >"$out/probe.txt" 2>&1
cat "$out/probe.txt"
grep -q "cuda_available True" "$out/probe.txt" || { echo "CUDA does not load: stopping"; exit 1; }

# "auto" resolves to CUDA through this variable; a session that cannot get CUDA raises instead of falling back.
EDGEPOP_PROVIDER=cuda timeout 330 "$py" -m pytest -q -p no:cacheprovider tests/dataplane tests/sim/live \
  >"$out/pytest_cuda.txt" 2>&1
echo "pytest rc=$?"; tail -25 "$out/pytest_cuda.txt"

for prov in cuda cpu; do
  EDGEPOP_PROVIDER=$prov timeout 120 "$py" benchmarks/bench_dataplane.py --quick >"$out/bench_dataplane_$prov.txt" 2>&1
  echo "bench_dataplane $prov rc=$?"; tail -1 "$out/bench_dataplane_$prov.txt"
done

timeout 150 "$py" -m edgepop profile --quick --provider cuda --out "$out/profile_cuda.csv" >"$out/profile.log" 2>&1
echo "profile rc=$?"; tail -3 "$out/profile.log"
