#!/usr/bin/env bash
# Offline Python environment for the GPU machines (no package index there).
#
#   scripts/gpu_env/stage.sh download [LOCK] [DIR]   # here, with PyPI: cp312 manylinux wheels -> DIR
#   scripts/gpu_env/stage.sh install  [LOCK] [DIR] [TARGET]
#                                                     # there, offline: the lock's packages the machine
#                                                     # lacks, from DIR into TARGET; prints the export
#
# Defaults: LOCK scripts/gpu_env/eval-tests.lock, DIR .whl (ignored by git; carry it to the
# machine), TARGET $GPU_ENV_SITE, else site/ in the temporary directory ($TMPDIR).
# Use: eval "$(scripts/gpu_env/stage.sh install)" && pytest -m gpu ...
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
cmd="${1:-}"
lock="${2:-${here}/eval-tests.lock}"
dir="${3:-.whl}"
target="${4:-${GPU_ENV_SITE:-${TMPDIR:-/tmp}/site}}"
py="${PYTHON:-python3}"

pins() { grep -Ev '^[[:space:]]*(#|$)' "${lock}"; }

case "${cmd}" in
  download)
    mkdir -p "${dir}"
    # --platform is matched exactly: the list covers the manylinux tags these wheels use.
    # shellcheck disable=SC2046
    "${py}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
      --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
      --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 -d "${dir}" $(pins)
    echo "wheels in ${dir}: $(find "${dir}" -name '*.whl' | wc -l)" >&2
    ;;
  install)
    missing=()
    while read -r pin; do
      "${py}" -m pip show -q "${pin%%==*}" >/dev/null 2>&1 || missing+=("${pin}")
    done < <(pins)
    if ((${#missing[@]})); then
      "${py}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --find-links "${dir}" \
        --target "${target}" "${missing[@]}" >&2
      echo "installed to ${target}: ${missing[*]}" >&2
    else
      echo "nothing missing" >&2
    fi
    # The checkout on the path too, as the image's editable install does: the eval workers and
    # the servers start from other working directories.
    echo "export PYTHONPATH=${target}:${repo}\${PYTHONPATH:+:\${PYTHONPATH}}"
    ;;
  *)
    sed -n '2,9p' "$0" >&2
    exit 2
    ;;
esac
