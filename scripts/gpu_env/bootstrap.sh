#!/usr/bin/env bash
# The whole trainer + rollout + evaluation stack on a bare GPU machine, offline, from one bundle.
#
#   Here (package index reachable; third_party/ fetched by scripts/fetch_upstream.sh):
#     s=scripts/gpu_env/stage.sh
#     $s download scripts/gpu_env/trainer.lock  .stage/trainer && $s trim .stage/trainer
#     $s download scripts/gpu_env/trainer-numpy.lock .stage/np
#     $s download scripts/gpu_env/eval-tests.lock .stage/eval
#     $s sources .stage/src
#     $s pack .stage .whl-parts          # pieces <= 58 MB + SHA256SUMS: carry them to PARTS there
#   There:
#     scripts/gpu_env/bootstrap.sh PARTS [STAGE]   # STAGE: default $TMPDIR/stage (or /tmp/stage)
#     source STAGE/env.sh                           # PATH, PYTHONPATH, TRAINER_PYTHONPATH,
#                                                   # SLIME_DIR, MEGATRON_DIR
#
# Unpacks the pieces (checked against SHA256SUMS), installs eval-tests.lock and trainer.lock into
# STAGE/site (Transformer Engine's torch extension is built there, minutes), trainer-numpy.lock
# into STAGE/np (NumPy 1.x for Megatron only), extracts slime and Megatron-LM into STAGE/src,
# writes STAGE/env.sh, and ends with the locks' import check. Re-running skips what is installed.
# EVAL_LOCK, TRAINER_LOCK and NUMPY_LOCK name other locks than eval-tests.lock, trainer.lock and
# trainer-numpy.lock beside this script (the offline test's small ones).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
[[ $# -ge 1 && "$1" != -* ]] || { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2; }
parts="$1"
stage="${2:-${TMPDIR:-/tmp}/stage}"
[[ "${stage}" == /* ]] || stage="${PWD}/${stage}"  # env.sh is sourced from other directories
s="${here}/stage.sh"
eval_lock="${EVAL_LOCK:-${here}/eval-tests.lock}"
trainer_lock="${TRAINER_LOCK:-${here}/trainer.lock}"
numpy_lock="${NUMPY_LOCK:-${here}/trainer-numpy.lock}"
t0=$SECONDS

bash "${s}" unpack "${parts}" "${stage}/bundle"
for d in trainer np eval src; do
  [[ -d "${stage}/bundle/${d}" ]] || { echo "[bootstrap] ERROR: the bundle has no ${d}/ (see the header)" >&2; exit 1; }
done
bash "${s}" install "${eval_lock}" "${stage}/bundle/eval" "${stage}/site" >/dev/null
site_export="$(bash "${s}" install "${trainer_lock}" "${stage}/bundle/trainer" "${stage}/site")"
bash "${s}" install "${numpy_lock}" "${stage}/bundle/np" "${stage}/np" >/dev/null
src_export="$(bash "${s}" unsources "${stage}/bundle/src" "${stage}/src")"
{
  echo "${site_export}"
  echo "${src_export}"
  printf 'export TRAINER_PYTHONPATH=%q\n' "${stage}/np"
  # shellcheck disable=SC2016  # $PYTHONPATH / $PATH expand where env.sh is sourced
  printf 'export PATH=%q:"$PATH"\n' "${stage}/site/bin"
} >"${stage}/env.sh.part"
mv "${stage}/env.sh.part" "${stage}/env.sh"
echo "[bootstrap] installed in $((SECONDS - t0)) s; source ${stage}/env.sh" >&2
# shellcheck disable=SC1091
source "${stage}/env.sh"
bash "${s}" check "${trainer_lock}"
