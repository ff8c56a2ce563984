"""The role a turn of an episode plays, chosen by what happened before it: the first
turn is the *generator* (writes the first kernel); a later turn is the *fixer* when the previous
attempt failed (no code, refused, compile or runtime error, incorrect) and the *optimizer* when it
was correct (its feedback carries the speedup and timings: make it faster). Each role's wording
can be set in the recipe (`episode.prompt.roles`); without it the prompts are the defaults.
"""

from __future__ import annotations

from dataclasses import dataclass

from eval_server.schema import EvalResult

__all__ = ["FIXER", "GENERATOR", "OPTIMIZER", "ROLES", "RolePrompt", "role_after"]

GENERATOR, FIXER, OPTIMIZER = "generator", "fixer", "optimizer"
ROLES = (GENERATOR, FIXER, OPTIMIZER)


@dataclass(frozen=True)
class RolePrompt:
    """One role's wording: `preamble` opens the user message that hands the turn to the role (for
    the generator: the first user message), `instruction` closes it (fixer and optimizer: instead
    of the prompt's fix_instruction / faster_instruction)."""

    preamble: str | None = None
    instruction: str | None = None


def role_after(result: EvalResult | None) -> str:
    """The role of the turn that follows an attempt: optimizer after a correct kernel, fixer after
    anything else (no code, a refused request, an error, a wrong result)."""
    return OPTIMIZER if result is not None and result.correct else FIXER
