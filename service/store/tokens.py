"""API tokens (sql/queries/tokens.sql): the commands make, list and revoke them, the API
looks them up."""

from __future__ import annotations

from typing import Any

from psycopg.rows import dict_row, tuple_row

from service.store.base import AsyncQueries, SyncQueries


class TokenQueries(AsyncQueries):
    """Tokens, as the API authenticates them."""

    async def lookup_token(self, *, token_hash: bytes) -> tuple[Any, ...] | None:
        """(id, owner, tenant, hash) of the unrevoked token with this hash, or None."""
        return await self._one("token_lookup", {"token_hash": token_hash}, row=tuple_row)


class SyncTokenQueries(SyncQueries):
    """Tokens, as the commands manage them."""

    def insert_token(self, *, owner: str, tenant: str | None, token_hash: bytes) -> int:
        """Stores a token's hash; its id."""
        [row] = self._rows("token_insert",
                           {"owner": owner, "tenant": tenant, "token_hash": token_hash})
        return int(row[0])

    def list_tokens(self) -> list[dict[str, Any]]:
        """Every token's id, owner, tenant and dates."""
        return self._rows("token_list", row=dict_row)

    def revoke_token(self, *, id: int) -> bool:
        """Revokes the token; False when no token has that id."""
        return bool(self._rows("token_revoke", {"id": id}))

    def lookup_token(self, *, token_hash: bytes) -> tuple[Any, ...] | None:
        """(id, owner, tenant, hash) of the unrevoked token with this hash, or None."""
        rows = self._rows("token_lookup", {"token_hash": token_hash})
        return rows[0] if rows else None
