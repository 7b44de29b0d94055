"""Whether and as whom gguf-mtp reaches the Hugging Face Hub: the offline switch and the token, read exactly as the
installed huggingface_hub reads them.

Token rule (the Hub's own): ``HF_TOKEN`` in the environment overrides the stored login (``hf auth login``).
"""

from __future__ import annotations

import os

from gguf_mtp.errors import HubError

__all__ = ["LOGIN_HINT", "check_token_env", "check_token_text", "is_offline", "require_online", "resolve_token"]

#: What a message says to do when no token (or a refused one) is set.
LOGIN_HINT = "set HF_TOKEN or run `hf auth login`"


def is_offline() -> bool:
    """Whether Hub access is switched off, exactly as the installed huggingface_hub decides it.

    ``huggingface_hub.constants.is_offline_mode()`` where the release has it, else its ``HF_HUB_OFFLINE``
    constant (both read ``HF_HUB_OFFLINE`` / ``TRANSFORMERS_OFFLINE`` when huggingface_hub is imported).
    """
    from huggingface_hub import constants

    check = getattr(constants, "is_offline_mode", None)
    return bool(check()) if callable(check) else bool(constants.HF_HUB_OFFLINE)


def require_online(what: str) -> None:
    """Raise a :class:`HubError` when the Hub cannot be reached by configuration.

    Raises:
        HubError: ``HF_HUB_OFFLINE`` is set.
    """
    if is_offline():
        raise HubError(f"cannot {what}: HF_HUB_OFFLINE is set (unset it, or use dry_run)", parameter="dry_run")


def resolve_token() -> str | None:
    """The token huggingface_hub would send: ``HF_TOKEN`` when set, else the stored login, else ``None``.

    Raises:
        HubError: the token holds characters an HTTP header cannot carry (a token is ASCII).
    """
    from huggingface_hub import get_token

    source = "HF_TOKEN" if os.environ.get("HF_TOKEN", "").strip() else "the stored Hugging Face token"
    try:
        token = get_token()
    except (OSError, UnicodeError):  # an unreadable stored-token file is the same as no token for our purpose
        return None
    if token:
        check_token_text(token, source)
    return token or None


def check_token_text(token: str, source: str = "HF_TOKEN") -> None:
    """Refuse a token that is not printable ASCII, before the HTTP layer fails on it with a traceback.

    Raises:
        HubError: ``token`` has a non-ASCII or a control character.
    """
    if not token.isascii():
        raise HubError(f"{source} contains non-ASCII characters; a Hugging Face token is ASCII (hf_...): set it again")
    if not token.isprintable():
        raise HubError(f"{source} contains control characters; a Hugging Face token is one printable word")


def check_token_env() -> None:
    """Check the token huggingface_hub will read (see :func:`resolve_token`), for code that lets it read it.

    Raises:
        HubError: see :func:`check_token_text`.
    """
    resolve_token()
