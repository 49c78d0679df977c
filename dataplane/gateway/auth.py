"""Bearer tokens per account: loaded from a file (TOML or JSON) and/or ``$EDGEPOP_TOKENS``, checked per request.

File forms::

    # tokens.toml
    [tokens]
    "tok-alice-1" = "alice"
    "tok-bob-1" = "bob"

    {"tokens": {"tok-alice-1": "alice"}}        # tokens.json

Environment: ``EDGEPOP_TOKENS="tok-alice-1:alice,tok-bob-1:bob"``.

A request without a valid ``Authorization: Bearer TOKEN`` is a 401; a valid token used on another account's
URL (``/accounts/{account_id}/...``) is a 403.
"""

from __future__ import annotations

import hmac
import json
import os
import tomllib
from pathlib import Path

from dataplane.gateway.errors import AUTH, GatewayError
from edgepop.errors import UserError

ENV_VAR = "EDGEPOP_TOKENS"
ANONYMOUS_ACCOUNT = "local"


SHORT, SPACED = "short", "spaced"  # what token_problem finds wrong with an entry


def token_problem(tok, acct) -> str | None:
    """What makes ``tok = acct`` no usable entry: SHORT (under 8 characters, or no account), SPACED (a space in the
    token, or around the account: no bearer header could ever match it), None when it is fine."""
    if not isinstance(tok, str) or len(tok) < 8 or not isinstance(acct, str) or not acct:
        return SHORT
    if any(c.isspace() for c in tok) or acct != acct.strip():
        return SPACED
    return None


def _check_table(table, where: str) -> dict[str, str]:
    if not isinstance(table, dict) or not table:
        raise UserError(f"{where}: expected a non-empty [tokens] table of token = account")
    for tok, acct in table.items():
        problem = token_problem(tok, acct)
        if problem == SHORT and isinstance(tok, str) and len(tok) >= 8:  # (the token is fine: its account is not)
            raise UserError(f"{where}: token {tok[:4]!r}...: its account must be a non-empty string, got {acct!r}")
        if problem == SHORT:
            raise UserError(f"{where}: token {str(tok)[:4]!r}...: tokens need 8+ characters and a non-empty account")
        if problem == SPACED:
            raise UserError(f"{where}: token {tok.strip()[:4]!r}...: a token holds no spaces and an account starts "
                            "and ends with no space")
    return dict(table)


def load_tokens_file(path: str | Path) -> dict[str, str]:
    """token -> account from a TOML or JSON file with a ``tokens`` table."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except FileNotFoundError:
        raise UserError(f"tokens file {str(path)!r} not found") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"tokens file {str(path)!r}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        doc = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (json.JSONDecodeError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"{path}: cannot parse tokens file: {exc}") from None
    if not isinstance(doc, dict) or "tokens" not in doc:
        raise UserError(f"{path}: no 'tokens' table")
    return _check_table(doc["tokens"], str(path))


def parse_tokens_env(value: str) -> dict[str, str]:
    """``"tok:acct,tok2:acct2"`` -> {tok: acct}."""
    out = {}
    for i, part in enumerate(p.strip() for p in value.split(",") if p.strip()):
        tok, sep, acct = part.rpartition(":")
        tok, acct = tok.strip(), acct.strip()  # (a request's bearer token is read stripped: so is this one)
        if not sep:
            raise UserError(f"${ENV_VAR}: entry {i + 1} is not TOKEN:ACCOUNT")
        if tok in out and out[tok] != acct:
            raise UserError(f"${ENV_VAR}: entry {i + 1} gives a token already given to account {out[tok]!r} to "
                            f"{acct!r}")
        out[tok] = acct
    return _check_table(out, f"${ENV_VAR}")


def load_tokens(path: str | Path | None = None, environ=None) -> dict[str, str]:
    """Tokens from ``path`` and ``$EDGEPOP_TOKENS`` together (the environment wins on a clash)."""
    environ = os.environ if environ is None else environ
    tokens = load_tokens_file(path) if path else {}
    if environ.get(ENV_VAR):
        tokens.update(parse_tokens_env(environ[ENV_VAR]))
    return tokens


class Authenticator:
    """Maps ``Authorization`` headers to accounts and enforces that the URL's account is the caller's."""

    def __init__(self, tokens: dict[str, str], enabled: bool = True):
        self.enabled = enabled
        self._tokens = [(t.encode(), a) for t, a in tokens.items()]
        if enabled and not self._tokens:
            raise UserError("no API tokens: give --tokens FILE, set EDGEPOP_TOKENS=token:account,..., or --no-auth")

    def account_of(self, authorization: str | None) -> str:
        """The account a header's bearer token belongs to (401 if none or unknown)."""
        if not self.enabled:
            return ANONYMOUS_ACCOUNT
        if not authorization or not authorization.lower().startswith("bearer "):
            raise GatewayError(401, AUTH, "Authentication error: missing 'Authorization: Bearer <token>' header")
        given = authorization[7:].strip().encode()
        found = None
        for tok, acct in self._tokens:  # compare every token in constant time: no early exit leaks a prefix
            if hmac.compare_digest(tok, given):
                found = acct
        if found is None:
            raise GatewayError(401, AUTH, "Authentication error: unknown API token")
        return found

    def check(self, authorization: str | None, account_id: str) -> str:
        """The caller's account, which must be ``account_id`` (403 otherwise)."""
        account = self.account_of(authorization)
        if self.enabled and account != account_id:
            raise GatewayError(403, AUTH, f"Authentication error: this token may not act for account {account_id!r}")
        return account
