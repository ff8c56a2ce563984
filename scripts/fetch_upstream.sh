#!/usr/bin/env bash
# Fetch the upstream sources this project is tested against and trains with, pinned:
#   slime        THUDM/slime        @ 624b824a898ab0ec1fcb4d373004c7f3852bf515  -> DEST/slime
#   Megatron-LM  NVIDIA/Megatron-LM @ 1dcf0dafa884ad52ffb243625717a3471643e087  -> DEST/Megatron-LM
# and apply slime's Megatron patches (slime's docker/patch/latest/megatron.patch, then
# megatron-sglang-aligned.patch) with `git apply --3way`, as slime's Docker image does.
#
# Usage: scripts/fetch_upstream.sh [DEST]      (DEST defaults to <repo>/third_party, git-ignored)
#
# The real-slime tests (tests/integration/test_real_slime_*.py) read DEST/slime and
# DEST/Megatron-LM (or SLIME_SRC / MEGATRON_SRC). Idempotent: a checkout already at the pinned
# commit is kept, patches this script applied before are not applied again; anything else
# already at DEST (another commit, not a git checkout, other local changes) is an error that says
# what to do, and nothing there is changed. On failure it removes only the directories this run created.
# Overrides (tests, mirrors): SLIME_REPO_URL, SLIME_COMMIT, MEGATRON_REPO_URL, MEGATRON_COMMIT.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
: "${SLIME_REPO_URL:=https://github.com/THUDM/slime.git}"
: "${SLIME_COMMIT:=624b824a898ab0ec1fcb4d373004c7f3852bf515}"
: "${MEGATRON_REPO_URL:=https://github.com/NVIDIA/Megatron-LM.git}"
: "${MEGATRON_COMMIT:=1dcf0dafa884ad52ffb243625717a3471643e087}"
PATCHES=(megatron.patch megatron-sglang-aligned.patch)  # slime's docker/patch/latest/, in order
REQUIRED_PATCH=megatron.patch

info() { printf '[fetch_upstream] %s\n' "$*" >&2; }
die() {
  printf '[fetch_upstream] ERROR: %s\n' "$*" >&2
  exit 1
}
usage() {
  sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d; s/^# \{0,1\}//' >&2
  exit "$1"
}

case "$#" in
  0) DEST="${ROOT}/third_party" ;;
  1) [[ "$1" == -h || "$1" == --help ]] && usage 0
     [[ "$1" == -* ]] && { printf '[fetch_upstream] ERROR: unknown option: %s\n' "$1" >&2; usage 2; }
     DEST="$1" ;;
  *) printf '[fetch_upstream] ERROR: at most one argument (DEST), got %s\n' "$#" >&2; usage 2 ;;
esac
command -v git >/dev/null || die "git is not installed"
mkdir -p "${DEST}" || die "cannot create ${DEST}"
DEST="$(cd "${DEST}" && pwd)"

CREATED=()  # directories this run created: the only ones removed on failure
cleanup() {
  local rc=$? dir
  if ((rc != 0)); then
    for dir in "${CREATED[@]}"; do
      info "removing ${dir} (created by this run, which failed)"
      rm -rf -- "${dir}"
    done
  fi
  exit "${rc}"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# checkout NAME URL COMMIT DIR: DIR at COMMIT, cloned if absent, kept if already there.
checkout() {
  local name="$1" url="$2" commit="$3" dir="$4" head
  if [[ -e "${dir}" ]]; then
    git -C "${dir}" rev-parse --is-inside-work-tree >/dev/null 2>&1 &&
      [[ "$(git -C "${dir}" rev-parse --show-toplevel)" == "${dir}" ]] ||
      die "${dir} exists but is not a git checkout of ${name}: move it away (or pass another DEST) and run again"
    head="$(git -C "${dir}" rev-parse HEAD)"
    [[ "${head}" == "${commit}" ]] ||
      die "${dir} is at ${head}, not the pinned ${name} commit ${commit}: move it away (or pass another DEST) and run again"
    info "${name}: ${dir} already at ${commit:0:12}"
    return
  fi
  info "${name}: fetching ${url} @ ${commit:0:12} into ${dir}"
  CREATED+=("${dir}")
  git init -q "${dir}"
  git -C "${dir}" remote add origin "${url}"
  # One commit, shallow, where the server allows fetching it by id (GitHub does); else all history.
  git -C "${dir}" fetch -q --depth 1 origin "${commit}" 2>/dev/null ||
    git -C "${dir}" fetch -q origin ||
    die "${name}: could not fetch ${url} (network, or a wrong SLIME_REPO_URL / MEGATRON_REPO_URL?)"
  git -C "${dir}" -c advice.detachedHead=false checkout -q "${commit}" ||
    die "${name}: commit ${commit} not found in ${url}"
}

# tree_state DIR: a fingerprint of DIR's changes against its HEAD (the index included).
tree_state() { git -C "$1" diff --binary HEAD | git hash-object --stdin; }

# apply_patches DIR PATCH...: a clean checkout gets the patches in order (--3way); one whose
# changes are exactly these patches, as recorded after a previous run, is left as it is.
apply_patches() {
  local dir="$1" marker want patch
  shift
  marker="$(git -C "${dir}" rev-parse --absolute-git-dir)/fetch_upstream.patched"
  want="$(cat "$@" | git hash-object --stdin)"
  if ! git -C "${dir}" diff --quiet HEAD; then
    [[ -f "${marker}" && "$(cat "${marker}")" == "${want} $(tree_state "${dir}")" ]] ||
      die "${dir} has changes that are not slime's patches (or older ones): move it away (or pass another DEST) and run again"
    info "Megatron-LM: slime's patches already applied"
    return
  fi
  for patch in "$@"; do
    git -C "${dir}" apply --3way "${patch}" ||
      die "Megatron-LM: $(basename "${patch}") did not apply to ${dir} (conflicts above)"
    info "Megatron-LM: applied $(basename "${patch}")"
  done
  printf '%s %s\n' "${want}" "$(tree_state "${dir}")" >"${marker}"
}

checkout slime "${SLIME_REPO_URL}" "${SLIME_COMMIT}" "${DEST}/slime"
checkout Megatron-LM "${MEGATRON_REPO_URL}" "${MEGATRON_COMMIT}" "${DEST}/Megatron-LM"
patch_dir="${DEST}/slime/docker/patch/latest"
[[ -f "${patch_dir}/${REQUIRED_PATCH}" ]] || die "slime's ${REQUIRED_PATCH} is missing from ${patch_dir}"
patches=()
for name in "${PATCHES[@]}"; do
  [[ -f "${patch_dir}/${name}" ]] && patches+=("${patch_dir}/${name}")
done
apply_patches "${DEST}/Megatron-LM" "${patches[@]}"
info "done: SLIME_SRC=${DEST}/slime MEGATRON_SRC=${DEST}/Megatron-LM"
