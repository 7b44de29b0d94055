"""``verify --acceptance``: a head that loads but predicts nothing fails verification.

``accept`` runs on the built-in prompts at n-max 1 (each cut to what fits a small context, with room to generate:
a measure of the head, not of those prompts) and the file fails below the floor. The default floor, 0.10, is
far below what working heads reach (0.5-0.9 first-token acceptance in the field) and far above what dead ones give
(0 of 3,595 drafts for one IQ3_S head; 1/vocabulary for a zeroed one): a file under it is broken, not weak.
"""

from __future__ import annotations

import os

from gguf_mtp.errors import GGUFMTPError, ParameterError
from gguf_mtp.model.drafting import tokenizer_refusal
from gguf_mtp.model.shards import open_model

from .accept import accept

__all__ = ["ACCEPTANCE_TOKENS", "DEFAULT_FLOOR", "acceptance_verdict", "refuse_unmeasurable"]

#: The lowest first-token acceptance (n-max 1, built-in prompts) ``verify --acceptance`` passes by default.
DEFAULT_FLOOR = 0.10
#: Tokens generated per built-in prompt for the check.
ACCEPTANCE_TOKENS = 64


def refuse_unmeasurable(model: str | os.PathLike[str]) -> None:
    """Refuse, before any check runs, a model whose head no prompt can measure (it has no tokenizer).

    Raises:
        ParameterError: one line naming the model.
        BadGGUFError, ShardSetError: ``model`` is not a readable GGUF model.
    """
    refusal = tokenizer_refusal(open_model(model))
    if refusal is not None:
        raise ParameterError(f"acceptance: {refusal}, so its head cannot be measured: leave --acceptance out",
                             os.fspath(model), "acceptance")


def acceptance_verdict(
    model: str | os.PathLike[str], *, draft: str | os.PathLike[str] | None = None, floor: float = DEFAULT_FLOOR
) -> tuple[bool, str]:
    """(passed, what was measured) for ``model`` (a composite, or a trunk with the sidecar ``draft``): the predicted
    n-max 1 acceptance on the built-in prompts against ``floor``. A model ``accept`` cannot run fails, with why."""
    try:
        report = accept(model, draft=draft, tokens=ACCEPTANCE_TOKENS, n_max=(1,), fit_context=True)
    except GGUFMTPError as e:
        return False, f"accept could not run: {e.message}"
    run = report.runs[0]
    if run.acceptance is None:
        return False, "nothing was drafted"
    cut = f"cut to fit the context of {report.n_ctx}, " if any(p.cut_from for p in report.prompts) else ""
    measured = (f"predicted acceptance {run.acceptance:.2f} at n-max 1 ({run.draft_n_accepted} of {run.draft_n} "
                f"drafts, built-in prompts, {cut}{ACCEPTANCE_TOKENS} tokens each)")
    if run.acceptance < floor:
        return False, f"{measured}: below the floor {floor:.2f}: the head predicts (almost) nothing"
    return True, f"{measured}, floor {floor:.2f}"
