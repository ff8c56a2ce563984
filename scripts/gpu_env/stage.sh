#!/usr/bin/env bash
# Offline Python environment for the GPU machines (no package index there).
#
#   scripts/gpu_env/stage.sh download [LOCK] [DIR]    # here, with PyPI: the lock's cp312 wheels -> DIR
#   scripts/gpu_env/stage.sh patch    [LOCK] [DIR]    # (part of download) slime's patches into DIR's wheels
#   scripts/gpu_env/stage.sh pack     [DIR] [PARTS]   # DIR -> PARTS/stage.tar.NN (<= 58 MB each) + SHA256SUMS
#   scripts/gpu_env/stage.sh unpack   [PARTS] [DIR]   # there: the pieces, checked, back into DIR
#   scripts/gpu_env/stage.sh install  [LOCK] [DIR] [TARGET]
#                                                     # there, offline: the lock's packages the machine
#                                                     # lacks, from DIR into TARGET; prints the export
#   scripts/gpu_env/stage.sh check    [LOCK]          # there: imports the lock's `#import` modules
#   scripts/gpu_env/stage.sh trim     [DIR]           # here, for a carry-limited machine: DIR's sglang_kernel
#                                                     # wheel without FA3, FlashMLA and sm100 (see below)
#   scripts/gpu_env/stage.sh sources  [DEST]          # here: the working trees of slime and Megatron-LM
#                                                     # (with slime's Megatron patches, without .git)
#                                                     # -> DEST/slime.tar.gz, DEST/Megatron-LM.tar.gz
#   scripts/gpu_env/stage.sh unsources [DIR] [TARGET] # there: them -> TARGET/slime, TARGET/Megatron-LM;
#                                                     # prints the export of SLIME_DIR and MEGATRON_DIR
#
# Defaults: LOCK scripts/gpu_env/eval-tests.lock, DIR .whl (ignored by git; carry it to the
# machine), PARTS .whl-parts, TARGET $GPU_ENV_SITE, else site/ in the temporary directory ($TMPDIR);
# for sources/unsources DEST and DIR .whl-src, TARGET src/ in the temporary directory; the sources
# from $SLIME_DIR and $MEGATRON_DIR, else third_party/slime and third_party/Megatron-LM.
# Use: eval "$(scripts/gpu_env/stage.sh install)" && pytest -m gpu ...
#      eval "$(scripts/gpu_env/stage.sh unsources)"
#
# A lock has one `name==version` per line; a comment after the pin says how it is staged:
#   # sdist         no wheel is published: built here into a wheel (pure Python)
#   # build-there   built on the GPU machine against its torch and CUDA (pip wheel --no-build-isolation)
#   # slime-patch   the wheel gets slime's patches of this package (slime's docker/patch/latest/,
#                   in its Dockerfile's order; slime's source from $SLIME_DIR, else third_party/slime)
# and `#import a.b c` lines name the modules `check` imports.
#
# `trim` replaces DIR's sglang_kernel wheel (0.4.4: 615 MB, 578 MB of it FlashAttention-3) by one
# without sgl_kernel/flash_ops.abi3.so (FA3), sgl_kernel/flashmla_ops.abi3.so (FlashMLA) and
# sgl_kernel/sm100/ (common_ops for every GPU but Hopper), repacked with the build tag `1trim`
# (the same version: the lock's pin installs it; 16.6 MB). Then sgl_kernel loads on Hopper (sm90)
# only and SGLang has no FA3: it needs `--attention-backend triton` (or flashinfer), which slime
# passes as `--sglang-attention-backend triton`. The Docker image keeps the full kernel.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "${here}/../.." && pwd)"
cmd="${1:-}"
py="${PYTHON:-python3}"
PIECE_BYTES="${PIECE_BYTES:-58000000}"     # the device's carry limit is 64 MiB per call
SLIME_PATCHES=(sglang.patch sglang-top_p.patch sglang-release_hicache.patch sglang-pull_weights.patch
  sglang-deterministic.patch)               # slime's Dockerfile applies them in this order

TRIMMED=(sgl_kernel/flash_ops.abi3.so sgl_kernel/flashmla_ops.abi3.so sgl_kernel/sm100)
scratch=()                                  # temporary paths, removed however the command ends
trap 'rm -rf "${scratch[@]}"' EXIT

info() { printf '[stage] %s\n' "$*" >&2; }
die() {
  printf '[stage] ERROR: %s\n' "$*" >&2
  exit 1
}
usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

# `name==version marker` for each pin of the lock (marker empty, sdist, build-there or slime-patch).
pins() {
  grep -Ev '^[[:space:]]*(#|$)' "${lock}" | while read -r pin rest; do
    marker="$(sed -nE 's/^#[[:space:]]*(sdist|build-there|slime-patch).*/\1/p' <<<"${rest}")"
    printf '%s %s\n' "${pin}" "${marker:-wheel}"
  done
}
check_lock() {  # in this shell: a bad line stops the command (pins runs in a subshell)
  [[ -f "${lock}" ]] || die "no lock file ${lock}"
  local bad
  bad="$(grep -Ev '^[[:space:]]*(#|$)' "${lock}" | grep -Ev '^[A-Za-z0-9][A-Za-z0-9._-]*(\[[a-z,]+\])?==[^[:space:]]+([[:space:]]+#[[:space:]]*(sdist|build-there|slime-patch)\b.*)?[[:space:]]*$' || true)"
  [[ -z "${bad}" ]] || die "${lock}: cannot read: ${bad}"
}
pins_with() { pins | awk -v m="$1" '$2 == m {print $1}'; }
name_of() { local n="${1%%==*}"; tr 'A-Z_.' 'a-z--' <<<"${n}"; }
# The distribution's file-name form (PEP 427/625: lower case, runs of -_. as _).
file_name_of() { sed -E 's/[-_.]+/_/g' <<<"$(name_of "$1")"; }

# The source distribution of `pin` into DIR as published (pip download would build its metadata,
# which for a torch extension means torch and its build requirements here).
fetch_sdist() {
  "${py}" - "$1" "${dir}" "${PIP_INDEX_URL:-https://pypi.org/simple}" <<'EOF'
import hashlib, json, sys, urllib.request
from pathlib import Path
pin, dest, index = sys.argv[1:]
name, version = pin.split("==")
norm = name.lower().replace("_", "-").replace(".", "-")
req = urllib.request.Request(f"{index.rstrip('/')}/{norm}/", headers={"Accept": "application/vnd.pypi.simple.v1+json"})
files = json.load(urllib.request.urlopen(req, timeout=120))["files"]
names = {f"{norm}-{version}.tar.gz", f"{norm.replace('-', '_')}-{version}.tar.gz"}
wanted = min(names)
found = [f for f in files if f["filename"].lower() in names]
if not found:
    sys.exit(f"[stage] ERROR: no source distribution {wanted} at {index}")
data = urllib.request.urlopen(found[0]["url"], timeout=600).read()
want = found[0].get("hashes", {}).get("sha256")
if want and hashlib.sha256(data).hexdigest() != want:
    sys.exit(f"[stage] ERROR: {found[0]['filename']} does not match its published sha256")
out = Path(dest) / found[0]["filename"]
part = out.with_name(out.name + ".part")
part.write_bytes(data)
part.rename(out)
print(f"[stage] {pin}: source distribution {out.name}", file=sys.stderr)
EOF
}

# Apply slime's patches to a downloaded wheel of `pin`, repacked with a build tag (same version,
# so pins on it still match) in place of the original.
slime_patch() {
  local pin="$1" wheel src work unpacked applied=0
  src="${SLIME_DIR:-${repo}/third_party/slime}/docker/patch/latest"
  [[ -d "${src}" ]] || die "slime's patches are not at ${src}: set SLIME_DIR (scripts/fetch_upstream.sh fetches slime)"
  src="$(cd "${src}" && pwd)"  # git -C below runs elsewhere
  wheel="$(find "${dir}" -maxdepth 1 -iname "$(file_name_of "${pin}")-${pin##*==}-*.whl" ! -name '*-1slime-*' | head -1)"
  [[ -n "${wheel}" ]] || { info "${pin}: already patched"; return; }
  work="$(mktemp -d)"
  scratch+=("${work}")
  "${py}" -m wheel unpack -d "${work}" "${wheel}" >/dev/null
  unpacked="$(find "${work}" -mindepth 1 -maxdepth 1 -type d | head -1)"
  for patch in "${SLIME_PATCHES[@]}"; do
    [[ -f "${src}/${patch}" ]] || continue
    # The patches are against the repository; the wheel holds its python/ directory.
    git -C "${unpacked}" apply -p2 --include='sglang/*' "${src}/${patch}" \
      || die "slime's ${patch} does not apply to ${wheel##*/}"
    applied=$((applied + 1))
  done
  ((applied)) || die "none of slime's ${SLIME_PATCHES[*]} is in ${src}"
  "${py}" -m wheel pack --build-number 1slime -d "${dir}" "${unpacked}" >/dev/null
  rm -rf "${work}" "${wheel}"
  info "${pin}: ${applied} of slime's patches applied"
}

# A file's size in MB, for the log.
size_of() { awk -v b="$(stat -c %s "$1")" 'BEGIN { printf "%.1f MB", b / 1e6 }'; }
# SRC to DEST through a rename beside DEST: DEST is never half-written.
move_into() {
  scratch+=("$2.part")
  mv -f "$1" "$2.part"
  mv -f "$2.part" "$2"
}

# DIR's sglang_kernel wheels without the TRIMMED members, repacked with the build tag 1trim (same
# version, so pins on it still match) in place of the originals.
trim() {
  local wheel work unpacked out trimmed member
  local -a wheels removed
  [[ -d "${dir}" ]] || die "no ${dir}: run download first"
  mapfile -t wheels < <(find "${dir}" -maxdepth 1 -iname 'sglang_kernel-*.whl' ! -name '*-1trim-*' | sort)
  if ((${#wheels[@]} == 0)); then
    if find "${dir}" -maxdepth 1 -iname 'sglang_kernel-*-1trim-*.whl' | grep -q .; then
      info "${dir}: sglang_kernel already trimmed"
    else
      info "${dir}: no sglang_kernel wheel, nothing to trim"
    fi
    return
  fi
  for wheel in "${wheels[@]}"; do
    work="$(mktemp -d)"
    scratch+=("${work}")
    "${py}" -m wheel unpack -d "${work}" "${wheel}" >/dev/null
    unpacked="$(find "${work}" -mindepth 1 -maxdepth 1 -type d | head -1)"
    removed=()
    for member in "${TRIMMED[@]}"; do
      if [[ -e "${unpacked}/${member}" ]]; then
        rm -rf "${unpacked:?}/${member}"
        removed+=("${member}")
      fi
    done
    if ((${#removed[@]} == 0)); then
      info "${wheel##*/}: none of ${TRIMMED[*]} in it, left as it is"
    else
      out="${work}/out"
      mkdir "${out}"
      "${py}" -m wheel pack --build-number 1trim -d "${out}" "${unpacked}" >/dev/null
      trimmed="$(find "${out}" -name '*.whl' | head -1)"
      [[ -n "${trimmed}" ]] || die "wheel pack wrote no wheel for ${wheel##*/}"
      info "${wheel##*/}: $(size_of "${wheel}") -> ${trimmed##*/}: $(size_of "${trimmed}") (without ${removed[*]})"
      move_into "${trimmed}" "${dir}/${trimmed##*/}"
      rm -f "${wheel}"
    fi
    rm -rf "${work}"
  done
}

case "${cmd}" in
  download)
    lock="${2:-${here}/eval-tests.lock}"
    dir="${3:-.whl}"
    check_lock
    mkdir -p "${dir}"
    mapfile -t wheels < <(pins_with wheel; pins_with slime-patch)
    mapfile -t sdists < <(pins_with sdist; pins_with build-there)
    if ((${#wheels[@]})); then
      # --platform is matched exactly: the list covers the manylinux tags these wheels use.
      "${py}" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_34_x86_64 --platform manylinux_2_28_x86_64 --platform manylinux_2_24_x86_64 \
        --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 --platform manylinux1_x86_64 \
        --platform linux_x86_64 -d "${dir}" "${wheels[@]}"
    fi
    for pin in $(pins_with sdist); do  # pure Python: a wheel built here installs there
      "${py}" -m pip wheel -q --no-deps --no-binary=:all: -w "${dir}" "${pin}"
    done
    for pin in $(pins_with build-there); do fetch_sdist "${pin}"; done
    for pin in $(pins_with slime-patch); do slime_patch "${pin}"; done
    info "in ${dir}: $(find "${dir}" -name '*.whl' | wc -l) wheels, ${#sdists[@]} source distributions"
    ;;
  patch)
    lock="${2:-${here}/eval-tests.lock}"
    dir="${3:-.whl}"
    check_lock
    for pin in $(pins_with slime-patch); do slime_patch "${pin}"; done
    ;;
  pack)
    dir="${2:-.whl}"
    parts="${3:-.whl-parts}"
    [[ -d "${dir}" ]] || die "no ${dir}: run download first"
    mkdir -p "${parts}"
    rm -f "${parts}"/stage.tar.* "${parts}/SHA256SUMS"
    tar -C "${dir}" -cf - . | split -b "${PIECE_BYTES}" -d -a 2 - "${parts}/stage.tar."
    (cd "${parts}" && sha256sum stage.tar.* >SHA256SUMS)
    info "${parts}: $(find "${parts}" -name 'stage.tar.*' | wc -l) pieces of at most ${PIECE_BYTES} bytes"
    ;;
  unpack)
    parts="${2:-.whl-parts}"
    dir="${3:-.whl}"
    [[ -f "${parts}/SHA256SUMS" ]] || die "no ${parts}/SHA256SUMS: carry the pieces and their SHA256SUMS"
    (cd "${parts}" && sha256sum --quiet -c SHA256SUMS) || die "a piece in ${parts} is missing or damaged"
    mkdir -p "${dir}"
    cat "${parts}"/stage.tar.* | tar -C "${dir}" -xf -
    info "${dir}: $(find "${dir}" -name '*.whl' | wc -l) wheels"
    ;;
  install)
    lock="${2:-${here}/eval-tests.lock}"
    dir="${3:-.whl}"
    target="${4:-${GPU_ENV_SITE:-${TMPDIR:-/tmp}/site}}"
    check_lock
    # Into an empty directory, then merged into TARGET: pip --target skips every top-level
    # directory that already exists there (bin/ of an earlier install: ray's command was left out;
    # transformer_engine/, shared by TE's wheels: the torch extension was left out) while the
    # dist-info says installed.
    put() {
      local fresh
      fresh="$(mktemp -d)"
      scratch+=("${fresh}")
      "${py}" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --find-links "${dir}" "$@" \
        --target "${fresh}" >&2
      mkdir -p "${target}"
      cp -a "${fresh}/." "${target}/"
      rm -rf "${fresh}"
    }
    wheels=() sources=()
    while read -r pin marker; do  # pins whose version neither the machine nor TARGET has
      if [[ "${marker}" == build-there ]]; then sources+=("${pin}"); else wheels+=("${pin}"); fi
    done < <(pins | PYTHONPATH="${target}${PYTHONPATH:+:${PYTHONPATH}}" "${py}" -c '
import sys
from importlib import metadata
for line in sys.stdin:
    pin, marker = line.split()
    name, version = pin.split("==")
    try:
        have = metadata.version(name.split("[")[0])
    except metadata.PackageNotFoundError:
        have = None
    if have != version:
        print(pin, marker)
')
    ((${#wheels[@]})) && put "${wheels[@]}"
    for pin in "${sources[@]}"; do  # after the wheels: built against the machine's torch and them
      sdist="$(find "${dir}" -maxdepth 1 -iname "$(file_name_of "${pin}")-${pin##*==}.tar.gz" | head -1)"
      [[ -n "${sdist}" ]] || die "no source distribution of ${pin} in ${dir}"
      info "building ${pin} on this machine (minutes)"
      built="$(mktemp -d)"
      PYTHONPATH="${target}${PYTHONPATH:+:${PYTHONPATH}}" "${py}" -m pip wheel -q --no-deps --no-index \
        --no-build-isolation -w "${built}" "${sdist}" >&2
      put --find-links "${built}" "${pin}"
      rm -rf "${built}"
    done
    if ((${#wheels[@]} + ${#sources[@]})); then
      info "installed to ${target}: ${wheels[*]} ${sources[*]}"
    else
      info "nothing missing"
    fi
    # The checkout on the path too, as the image's editable install does: the eval workers and
    # the servers start from other working directories.
    # shellcheck disable=SC2016  # $PYTHONPATH / $PATH expand where env.sh is sourced
    printf 'export PYTHONPATH=%q${PYTHONPATH:+:"$PYTHONPATH"}\n' "${target}:${repo}"  # quoted: a path may hold spaces
    ;;
  check)
    lock="${2:-${here}/eval-tests.lock}"
    read -ra modules <<<"$(sed -nE 's/^#import[[:space:]]+//p' "${lock}" | tr -s ' \n' ' ')"
    ((${#modules[@]})) || die "${lock} names no #import modules"
    "${py}" - "${modules[@]}" <<'EOF'
import importlib, sys, time
failed = []
for name in sys.argv[1:]:
    t0 = time.perf_counter()
    try:
        importlib.import_module(name)
    except Exception as exc:  # each failure reported, all modules tried
        failed.append(f"{name}: {type(exc).__name__}: {exc}")
print(("import check: all %d modules import" % (len(sys.argv) - 1)) if not failed else "import check FAILED:\n  " + "\n  ".join(failed))
sys.exit(1 if failed else 0)
EOF
    ;;
  trim)
    dir="${2:-.whl}"
    trim
    ;;
  sources)
    dest="${2:-.whl-src}"
    names=(slime Megatron-LM)
    srcs=("${SLIME_DIR:-${repo}/third_party/slime}" "${MEGATRON_DIR:-${repo}/third_party/Megatron-LM}")
    markers=(train.py megatron/core)  # a path that says the tree is that source
    vars=(SLIME_DIR MEGATRON_DIR)
    for i in 0 1; do  # both checked before anything is written
      [[ -e "${srcs[i]}/${markers[i]}" ]] || die "no ${names[i]} source at ${srcs[i]} (no ${markers[i]}):" \
        "scripts/fetch_upstream.sh fetches it (or set ${vars[i]})"
    done
    mkdir -p "${dest}"
    for i in 0 1; do
      out="${dest}/${names[i]}.tar.gz"
      scratch+=("${out}.part")
      # The working tree as it is: slime's Megatron patches are uncommitted changes there.
      tar -C "${srcs[i]}" --exclude=.git --exclude=__pycache__ -czf "${out}.part" .
      mv -f "${out}.part" "${out}"
      info "${out}: $(size_of "${out}") (${srcs[i]})"
    done
    ;;
  unsources)
    dir="${2:-.whl-src}"
    target="${3:-${TMPDIR:-/tmp}/src}"
    for name in slime Megatron-LM; do
      [[ -f "${dir}/${name}.tar.gz" ]] || die "no ${dir}/${name}.tar.gz: run \`stage.sh sources\` and carry it"
    done
    mkdir -p "${target}"
    target="$(cd "${target}" && pwd)"  # the export must hold from any directory
    for name in slime Megatron-LM; do
      into="$(mktemp -d "${target}/.${name}.XXXXXX")"
      scratch+=("${into}")
      tar -C "${into}" --no-same-owner -xzf "${dir}/${name}.tar.gz"
      chmod 755 "${into}"
      rm -rf "${target:?}/${name}"  # replaced whole: nothing left of an older copy
      mv "${into}" "${target}/${name}"
    done
    info "sources in ${target}: slime, Megatron-LM"
    printf 'export SLIME_DIR=%q MEGATRON_DIR=%q\n' "${target}/slime" "${target}/Megatron-LM"
    ;;
  *) usage ;;
esac
