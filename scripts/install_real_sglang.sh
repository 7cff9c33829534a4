#!/usr/bin/env bash
# Build a virtual environment that runs a real SGLang server (`make real-sglang`).
#
#   scripts/install_real_sglang.sh VENV [cpu|gpu]
#
# cpu (default): SGLang with --no-deps beside the pinned runtime packages of
#   scripts/conformance-requirements.txt (torch 2.14.1 among them, CUDA-only kernels left out),
#   and the Python package of the pinned sglang-kernel wheel without its compiled ops: no CPU
#   build of it is on the registry, so SGLang falls back to its torch-native kernels. About
#   3-5 minutes and 6.5 GB.
# gpu: `pip install sglang==VERSION` with all its dependencies (the registry's CUDA build).
set -euo pipefail
VENV=${1:?usage: install_real_sglang.sh VENV [cpu|gpu]}
MODE=${2:-cpu}
SGLANG_VERSION=${SGLANG_VERSION:-0.5.23}
SGLANG_KERNEL_VERSION=${SGLANG_KERNEL_VERSION:-0.4.10}
PIP_FLAGS=${PIP_FLAGS:---disable-pip-version-check -q}
HERE=$(cd "$(dirname "$0")" && pwd)
PYTHON=${PYTHON:-python3}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
PIP="$VENV/bin/pip"
if [ "$MODE" = gpu ]; then
    # shellcheck disable=SC2086
    "$PIP" install $PIP_FLAGS "sglang==$SGLANG_VERSION"
    exit 0
fi
[ "$MODE" = cpu ] || { echo "install_real_sglang.sh: mode must be cpu or gpu, not $MODE" >&2; exit 2; }

# shellcheck disable=SC2086
"$PIP" install $PIP_FLAGS --no-deps -r "$HERE/conformance-requirements.txt" "sglang==$SGLANG_VERSION"

SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
# shellcheck disable=SC2086
"$PIP" download $PIP_FLAGS --no-deps "sglang-kernel==$SGLANG_KERNEL_VERSION" -d "$WORK"
WHEEL=$(ls "$WORK"/sglang_kernel-*.whl)
rm -rf "$SITE/sgl_kernel"
"$VENV/bin/python" - "$WHEEL" "$SITE" <<'PY'
import sys, zipfile
wheel, site = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("sgl_kernel/") and n.endswith(".py")]
    z.extractall(site, names)
print(f"sgl_kernel: {len(names)} Python files from {wheel.rsplit('/', 1)[-1]}, no compiled ops")
PY
# sgl_kernel loads `common_ops` at import; an empty one lets SGLang start on the CPU and use
# its torch-native fallbacks.
echo '# No compiled ops on this CPU: SGLang falls back to its torch-native kernels.' \
    > "$SITE/sgl_kernel/common_ops.py"
"$VENV/bin/python" -c "import sglang.launch_server" 2>/dev/null \
    && echo "SGLang $SGLANG_VERSION imports in $VENV" \
    || { echo "install_real_sglang.sh: SGLang does not import in $VENV" >&2; exit 1; }
