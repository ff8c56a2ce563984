"""Preflight: check a machine and a run's settings before launching (`scripts/preflight.sh`).

Checks checkpoints and their format, MODEL_ARGS against the HF config, data files, the recipe,
the tokenizer, the GPU count against the requested split, free ports, tools and versions
(tmux, slime, Megatron-LM, SGLang, Ray, torch, Triton), whether the eval server's candidates can
get read-only file systems, and W&B settings, then prints one row per
check: PASS / WARN / FAIL, what was found, and for each failure the fix.

Settings are the launcher's environment variables; their defaults come from
`configs/run/common.sh` (read through bash, so there is one source for them):

  scripts/preflight.sh                        # the main run's settings
  TRAIN_GPUS=2 ROLLOUT_GPUS=1 EVAL_GPUS=1 HF_CKPT=/data/Qwen3-8B scripts/preflight.sh
  python -m tools.preflight --json out.json   # same checks, also written as JSON
  python -m tools.preflight --gate            # the launcher's start gate (below)

Exit code 0 when nothing failed (warnings allowed), 1 otherwise.

`--gate` runs only the checks of what slime's trainer reads at start (HF checkpoint and
tokenizer, REF_LOAD, LOAD_DIR, MODEL_ARGS against config.json, prompt data), prints nothing when
they pass and otherwise one line: the first failure and its fix. The launcher runs it before it
starts anything, so a wrong path stops the run at once instead of after Ray and Megatron started.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from krl_common.cli import make_parser
from tools import run_plan

REPO = Path(__file__).resolve().parent.parent
PASS, WARN, FAIL = "PASS", "WARN", "FAIL"

SETTINGS = [
    "SLIME_DIR",
    "MEGATRON_DIR",
    "MODEL",
    "MODEL_ARGS_FILE",
    "HF_CKPT",
    "REF_LOAD",
    "LOAD_DIR",
    "SAVE_DIR",
    "PROMPT_DATA",
    "RECIPE",
    "BACKEND",
    "TRAIN_GPUS",
    "ROLLOUT_GPUS",
    "EVAL_GPUS",
    "COLOCATE",
    "TP",
    "CP",
    "PP",
    "ROLLOUT_GPUS_PER_ENGINE",
    "TRAIN_ONLY",
    "EVAL_DEVICES",
    "MODE",
    "ENGINE",
    "ENGINE_PORT",
    "SGLANG_URL",
    "ROUTER_HOST",
    "SLIME_HOST_IP",
    "EVAL_PORT",
    "BUFFER_PORT",
    "ROUTER_PORT",
    "RAY_PORT",
    "RAY_DASHBOARD_PORT",
    "RAY_CLIENT_PORT",
    "RAY_AGENT_PORT",
    "WANDB_PROJECT",
    "RUN_DIR",
]

# MODEL_ARGS flag -> HF config.json key (what slime's megatron_parse_args asserts).
ARCH_FLAGS = {
    "--num-layers": "num_hidden_layers",
    "--hidden-size": "hidden_size",
    "--ffn-hidden-size": "intermediate_size",
    "--num-attention-heads": "num_attention_heads",
    "--num-query-groups": "num_key_value_heads",
    "--rotary-base": "rope_theta",
    "--norm-epsilon": "rms_norm_eps",
}


@dataclass
class Check:
    name: str
    status: str
    detail: str
    fix: str = ""


# Settings that name the run whose checkpoint a launch resumes from. When none is given,
# configs/run/common.sh invents RUN_NAME from the clock: that LOAD_DIR cannot exist yet, so
# checking it says nothing, and the resume row says so instead.
RUN_NAMING = ("RUN_NAME", "RUN_DIR", "SAVE_DIR", "LOAD_DIR")
RUN_NAMED = "RUN_NAMED"  # key added to the settings: "1" when the caller set one of RUN_NAMING


class SettingsError(RuntimeError):
    """configs/run/common.sh refused the settings (e.g. an unknown PRESET); the message says why."""


def launcher_settings(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The launcher's settings: `env` over the defaults of configs/run/common.sh (and of the
    preset PRESET names), plus RUN_NAMED."""
    env = os.environ if env is None else env
    script = f'source "{REPO}/scripts/lib/common.sh"; source "{REPO}/configs/run/common.sh"; ' + "; ".join(
        f'printf "%s\\0" "${{{name}-}}"' for name in SETTINGS
    )
    res = subprocess.run(["bash", "-c", script], env=dict(env), capture_output=True)
    if res.returncode != 0:
        lines = res.stderr.decode(errors="replace").strip().splitlines()
        raise SettingsError(lines[-1] if lines else f"configs/run/common.sh exited with {res.returncode}")
    settings = dict(zip(SETTINGS, res.stdout.decode().split("\0")[: len(SETTINGS)], strict=True))
    settings[RUN_NAMED] = "1" if any(env.get(k) for k in RUN_NAMING) else ""
    return settings


# --------------------------------------------------------------------------- checks


def check_hf_checkpoint(s: Mapping[str, str]) -> list[Check]:
    path = Path(s["HF_CKPT"])
    fix = (
        "put the HF model there (the tiny model of PRESET=single_gpu_tiny: python -m slime_ext.dev_engine.tiny_model "
        "--out DIR), or set HF_CKPT=/path/to/model"
    )
    if not path.is_dir():
        return [Check("hf checkpoint", FAIL, f"{path} not found", fix)]
    config = path / "config.json"
    if not config.is_file():
        return [Check("hf checkpoint", FAIL, f"{path} has no config.json", fix)]
    try:
        cfg = json.loads(config.read_text(encoding="utf-8"))
    except ValueError as exc:
        return [Check("hf checkpoint", FAIL, f"{config}: not JSON ({exc})", fix)]
    weights = list(path.glob("*.safetensors")) + list(path.glob("*.bin"))
    checks = [
        Check(
            "hf checkpoint",
            PASS if weights else FAIL,
            f"{path}: model_type={cfg.get('model_type')}, {len(weights)} weight file(s)",
            "" if weights else "the directory has no *.safetensors / *.bin weights: " + fix,
        )
    ]
    has_tok = (path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file()
    checks.append(
        _tokenizer_check(path)
        if has_tok
        else Check(
            "tokenizer",
            FAIL,
            f"{path} has no tokenizer.json / tokenizer_config.json",
            "copy the tokenizer files of the model into HF_CKPT",
        )
    )
    return checks


def _tokenizer_check(path: Path) -> Check:
    try:
        from transformers import AutoTokenizer
    except ImportError:
        return Check(
            "tokenizer", WARN, "transformers not installed: tokenizer not loaded", "pip install transformers"
        )
    try:
        tok = AutoTokenizer.from_pretrained(path)
    except Exception as exc:  # any loader failure is the finding
        return Check(
            "tokenizer", FAIL, f"{path}: {type(exc).__name__}: {exc}"[:300], "fix the tokenizer files"
        )
    if not getattr(tok, "chat_template", None):
        return Check(
            "tokenizer", FAIL, f"{path}: no chat template", "use the instruct model's tokenizer files"
        )
    end = tok.convert_tokens_to_ids("<|im_end|>")
    if end is None or end == tok.unk_token_id:
        return Check(
            "tokenizer",
            WARN,
            f"{path}: no <|im_end|> token (episode.end_of_turn must match)",
            "set kernel_rl.episode.end_of_turn to the model's end-of-turn token",
        )
    return Check("tokenizer", PASS, f"{path}: vocab {len(tok)}, chat template, <|im_end|>={end}")


def check_torch_dist(name: str, value: str, *, required: bool, hf_dir: str = "HF_CKPT") -> Check:
    """A Megatron torch_dist checkpoint dir (latest_checkpointed_iteration.txt + its iteration dir),
    or an HF dir (slime also loads those)."""
    path = Path(value)
    convert = f"convert the HF model: scripts/convert_hf_to_megatron.sh --hf-dir {hf_dir} --out {path}"
    if not path.is_dir():
        if required:
            return Check(name, FAIL, f"{path} not found", convert + " (docs/CONVERT.md)")
        return Check(name, PASS, f"{path} empty: a fresh run (nothing to resume)")
    tracker = path / "latest_checkpointed_iteration.txt"
    if tracker.is_file():
        it = tracker.read_text().strip()
        sub = path / ("release" if it == "release" else f"iter_{int(it):07d}" if it.isdigit() else it)
        if not sub.is_dir():
            return Check(
                name,
                FAIL,
                f"{tracker} says {it!r} but {sub} is missing",
                "the checkpoint is incomplete: re-convert or point to another directory",
            )
        shards = list(sub.glob("*.distcp"))
        if not shards or not (sub / ".metadata").is_file():
            return Check(name, FAIL, f"{sub}: no .metadata / *.distcp (not torch_dist format)", convert)
        what = "resume from" if name == "load (resume)" else "torch_dist"
        return Check(name, PASS, f"{path}: {what} iteration {it}, {len(shards)} shard(s)")
    if (path / "config.json").is_file():
        return Check(
            name, PASS if name != "load (resume)" else WARN, f"{path}: an HF directory (slime loads it)"
        )
    if required:
        return Check(
            name, FAIL, f"{path}: neither torch_dist (latest_checkpointed_iteration.txt) nor HF", convert
        )
    return Check(name, PASS, f"{path}: no checkpoint yet (a fresh run)")


def check_resume(s: Mapping[str, str]) -> Check:
    """LOAD_DIR, only for a named run: an unnamed launch gets a new RUN_NAME, so nothing to resume."""
    if s.get(RUN_NAMED):
        return check_torch_dist("load (resume)", s["LOAD_DIR"], required=False, hf_dir=s["HF_CKPT"])
    return Check(
        "load (resume)",
        PASS,
        "not checked: RUN_NAME is not set, so a launch starts a new run (a fresh name) with nothing to "
        "resume; set RUN_NAME (or LOAD_DIR) to check that run's checkpoint",
    )


def _model_args(path: Path) -> list[str]:
    out = subprocess.run(
        ["bash", "-c", 'source "$1"; printf "%s\\n" "${MODEL_ARGS[@]}"', "_", str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return out.stdout.split()


def check_model_args(s: Mapping[str, str]) -> Check:
    path = Path(s["MODEL_ARGS_FILE"])
    if not path.is_file():
        return Check(
            "model args",
            FAIL,
            f"{path} not found",
            f"generate it from the HF config (tools/gen_model_args.py) or set MODEL (now {s['MODEL']})",
        )
    try:
        args = _model_args(path)
    except subprocess.CalledProcessError as exc:
        return Check("model args", FAIL, f"{path}: bash error {exc.stderr.strip()[:200]}", "fix the file")
    config = Path(s["HF_CKPT"]) / "config.json"
    if not config.is_file():
        return Check("model args", WARN, f"{path}: {len(args)} flags; no HF config to compare with", "")
    cfg = json.loads(config.read_text(encoding="utf-8"))
    flags = {a: args[i + 1] for i, a in enumerate(args[:-1]) if a.startswith("--")}
    wrong = []
    for flag, key in ARCH_FLAGS.items():
        if flag in flags and key in cfg and float(flags[flag]) != float(cfg[key]):
            wrong.append(f"{flag} {flags[flag]} vs {key} {cfg[key]}")
    tied = "--untie-embeddings-and-output-weights" not in args
    if "tie_word_embeddings" in cfg and tied != bool(cfg["tie_word_embeddings"]):
        wrong.append(f"tied embeddings {tied} vs tie_word_embeddings {cfg['tie_word_embeddings']}")
    if wrong:
        return Check(
            "model args",
            FAIL,
            f"{path} disagrees with {config}: " + "; ".join(wrong),
            "regenerate the model args from this config.json, or pick the matching MODEL",
        )
    return Check("model args", PASS, f"{path}: {len(flags)} flags agree with {config.name}")


def check_prompt_data(s: Mapping[str, str]) -> Check:
    from krl_common.validation import ValidationError
    from slime_ext.rollout.problems import load_prompt_records

    path = Path(s["PROMPT_DATA"])
    fix = "prepare it: python -m tools.prepare_kernelbench (see docs/LAUNCH.md), or set PROMPT_DATA"
    if not path.is_file():
        return Check("prompt data", FAIL, f"{path} not found", fix)
    try:
        records = load_prompt_records(path)
    except (ValidationError, ValueError) as exc:
        return Check(
            "prompt data", FAIL, str(exc)[:300], "fix the file (slime_ext/rollout/problems.py defines it)"
        )
    train = sum(r.split == "train" for r in records)
    status = PASS if train else FAIL
    return Check(
        "prompt data",
        status,
        f"{path}: {len(records)} records, {train} train",
        "" if train else "no train-split records: prepare the data with a train split",
    )


def check_recipe(s: Mapping[str, str]) -> Check:
    from krl_common.validation import ValidationError
    from slime_ext.rollout.recipe import episode_config_from_recipe, load_recipe, recipe_section

    path = Path(s["RECIPE"])
    if not path.is_file():
        return Check(
            "recipe", FAIL, f"{path} not found", "set RECIPE=configs/recipe/kernelbench_multiturn.yaml"
        )
    try:
        recipe = load_recipe(path)
        # BACKEND: what the launcher writes into the run's recipe
        ep = episode_config_from_recipe(recipe, backend=s.get("BACKEND") or None)
    except (ValidationError, ValueError) as exc:
        return Check("recipe", FAIL, f"{path}: {exc}"[:300], "fix the named key")
    temp = recipe_section(recipe, "runner").get("temperature")
    if temp is None:
        return Check(
            "recipe",
            FAIL,
            f"{path}: kernel_rl.runner.temperature not set",
            "set it: slime's --rollout-temperature is read from it",
        )
    return Check(
        "recipe",
        PASS,
        f"{path}: backend {ep.backend}, max_turns {ep.max_turns}, gamma {ep.reward.gamma}, "
        f"credit {ep.reward.credit}, temperature {temp}",
    )


def check_gpus(s: Mapping[str, str], count: int) -> Check:
    """The launcher's own split (tools/run_plan.py) on `count` visible GPUs."""
    try:
        plan = run_plan.plan_gpus({**s, "PRINT_ONLY": "0"}, list(range(count)))
    except run_plan.PlanError as exc:
        return Check(
            "gpu split",
            FAIL,
            str(exc),
            "lower TRAIN_GPUS/ROLLOUT_GPUS/EVAL_GPUS, use COLOCATE=1 or EVAL_DEVICES, or run on a larger machine",
        )
    return Check("gpu split", PASS, plan.describe())


def port_free(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def check_ports(s: Mapping[str, str]) -> Check:
    """The ports the launcher's plan (tools/run_plan.py) needs free, and its endpoints' rules."""
    try:
        ports = run_plan.plan_endpoints(s).ports
    except run_plan.PlanError as exc:
        return Check("ports", FAIL, str(exc), "see the message: the launcher refuses the same")
    names = [n for n in run_plan.PORTS if s.get(n) and int(s[n]) in ports]
    busy = [f"{n}={s[n]}" for n in names if not port_free(int(s[n]))]
    if busy:
        return Check(
            "ports",
            FAIL,
            "in use: " + ", ".join(busy),
            "stop what listens there (another run: scripts/stop.sh RUN_DIR) or choose other ports",
        )
    return Check("ports", PASS, ", ".join(f"{n}={s[n]}" for n in names) + " free")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def check_trainer_requirements(s: Mapping[str, str]) -> list[Check]:
    """What starting slime's trainer needs before anything else: slime's and Megatron-LM's
    sources and Ray (the trainer window runs `ray start` and `ray job submit`)."""
    checks = []
    for name, env_key, marker in (
        ("slime", "SLIME_DIR", "train.py"),
        ("Megatron-LM", "MEGATRON_DIR", "megatron"),
    ):
        path = Path(s[env_key])
        if (path / marker).exists():
            rev = subprocess.run(
                ["git", "-C", str(path), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
            ).stdout.strip()
            checks.append(Check(name, PASS, f"{path}" + (f" @ {rev}" if rev else "")))
        else:
            checks.append(
                Check(
                    name,
                    FAIL,
                    f"{path}/{marker} not found",
                    f"run inside the slime image (docker/README.md) or set {env_key}",
                )
            )
    checks.append(
        Check("ray", PASS, version)
        if (version := _version("ray"))
        else Check(
            "ray",
            FAIL,
            "not installed",
            "use the slime image (docker/README.md) or pip install 'ray[default]'",
        )
    )
    return checks


def check_versions(s: Mapping[str, str]) -> list[Check]:
    checks = check_trainer_requirements(s)
    # wandb is not here: it matters only when W&B logging is on, and check_wandb owns that row.
    for dist in ("sglang", "torch", "triton", "transformers"):
        version = _version(dist)
        if version:
            checks.append(Check(dist, PASS, version))
        else:
            checks.append(Check(dist, FAIL, "not installed", "use the slime image (docker/README.md)"))
    checks.append(
        Check("tmux", PASS, shutil.which("tmux") or "")
        if shutil.which("tmux")
        else Check("tmux", FAIL, "not found", "apt-get install tmux")
    )
    return checks


def check_wandb(s: Mapping[str, str], env: Mapping[str, str]) -> Check:
    """The one W&B row: off passes; on needs the package and credentials (or offline mode)."""
    if not s["WANDB_PROJECT"]:
        return Check("wandb", PASS, "off (set WANDB_PROJECT to log to Weights & Biases)")
    if _version("wandb") is None:
        return Check(
            "wandb",
            FAIL,
            f"WANDB_PROJECT={s['WANDB_PROJECT']} but wandb is not installed",
            "pip install wandb",
        )
    netrc = Path(env.get("NETRC", Path.home() / ".netrc"))
    logged_in = netrc.is_file() and "api.wandb.ai" in netrc.read_text(errors="replace")
    if env.get("WANDB_API_KEY") or logged_in or env.get("WANDB_MODE") == "offline":
        how = (
            "WANDB_API_KEY set"
            if env.get("WANDB_API_KEY")
            else "offline mode"
            if not logged_in
            else "wandb login"
        )
        return Check("wandb", PASS, f"project {s['WANDB_PROJECT']} ({how})")
    return Check(
        "wandb",
        FAIL,
        f"WANDB_PROJECT={s['WANDB_PROJECT']} but no credentials",
        "run `wandb login`, export WANDB_API_KEY, or WANDB_MODE=offline",
    )


def check_isolation(refused: Callable[[list[str]], str] | None = None) -> Check:
    """Whether the eval server's candidates' processes can get read-only file systems here
    (`--runner-read-only auto` turns them on where the kernel grants a user namespace): a
    container started with Docker's default seccomp profile refuses it."""
    if refused is None:
        from eval_server.isolation.sandbox import confinement_refused as refused
    with tempfile.TemporaryDirectory(prefix="krl-preflight-") as tmp:
        why = refused([tmp])
    if not why:
        return Check("read-only runners", PASS, "user and mount namespaces granted: candidates see read-only file systems")
    return Check(
        "read-only runners",
        WARN,
        f"refused here ({why}): candidates' processes keep writable file systems (the eval server still runs)",
        "start the container with a seccomp profile that allows unshare (e.g. docker run --security-opt "
        "seccomp=unconfined) or --privileged; docs/EVAL_SERVER.md, Isolation",
    )


def gate_checks(settings: Mapping[str, str]) -> list[Check]:
    """What slime's trainer reads at start: the launcher's gate (`--gate`)."""
    checks = check_hf_checkpoint(settings)
    hf = settings["HF_CKPT"]
    checks.append(check_torch_dist("ref load", settings["REF_LOAD"], required=True, hf_dir=hf))
    checks.append(check_resume(settings))
    checks.append(check_model_args(settings))
    checks.append(check_prompt_data(settings))
    return checks


def gate_line(checks: list[Check]) -> str | None:
    """One line for the first failed check (None when none failed)."""
    failed = [c for c in checks if c.status == FAIL]
    if not failed:
        return None
    more = f" [{len(failed) - 1} more: scripts/preflight.sh lists them]" if len(failed) > 1 else ""
    return f"{failed[0].name}: {failed[0].detail} -> fix: {failed[0].fix}{more}"


def run_checks(
    settings: Mapping[str, str],
    *,
    env: Mapping[str, str] | None = None,
    gpus: Callable[[], int] = run_plan.gpu_count,
) -> list[Check]:
    env = os.environ if env is None else env
    checks = gate_checks(settings)
    checks.append(check_recipe(settings))
    checks.append(check_gpus(settings, gpus()))
    checks.append(check_ports(settings))
    checks += check_versions(settings)
    checks.append(check_isolation())
    checks.append(check_wandb(settings, env))
    return checks


def format_table(checks: list[Check]) -> str:
    w_name = max(len(c.name) for c in checks)
    lines = []
    for c in checks:
        lines.append(f"{c.status:4}  {c.name.ljust(w_name)}  {c.detail}")
        if c.fix and c.status != PASS:
            lines.append(f"{'':4}  {'':{w_name}}  fix: {c.fix}")
    failed = sum(c.status == FAIL for c in checks)
    warned = sum(c.status == WARN for c in checks)
    lines.append(
        f"{len(checks)} checks: {len(checks) - failed - warned} passed, {warned} warnings, {failed} failed"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = make_parser("tools.preflight", __doc__)
    p.add_argument("--json", type=Path, help="also write the checks as JSON here")
    p.add_argument(
        "--gate", action="store_true", help="only the trainer's inputs; silent, or one line on failure"
    )
    args = p.parse_args(argv)
    try:
        settings = launcher_settings()
    except SettingsError as exc:
        print(exc)
        return 1
    if args.gate:  # the trainer's own requirements first: without them nothing else matters
        line = gate_line(check_trainer_requirements(settings) + gate_checks(settings))
        if line:
            print(line)
        return 1 if line else 0
    checks = run_checks(settings)
    print(format_table(checks))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in checks], indent=2) + "\n", encoding="utf-8")
    return 1 if any(c.status == FAIL for c in checks) else 0


if __name__ == "__main__":
    sys.exit(main())
