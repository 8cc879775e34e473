"""The decider protocol. Deciders only propose; the executor validates and persists before acting.

The decisions themselves (ToolCall, Finish, ..., Proposal, DecisionContext) live in
executor/decisions.py, which the code-first API (executor/sdk.py) shares.
"""

from __future__ import annotations

from typing import Protocol

from executor.decisions import (
    DeciderUnavailable,
    Decision,
    DecisionContext,
    Fail,
    Finish,
    Invalid,
    InvalidKind,
    Proposal,
    Sleep,
    SpawnChildren,
    ToolCall,
    WaitForInput,
    WaitForSignal,
)

__all__ = ["Decider", "DeciderUnavailable", "Decision", "DecisionContext", "Fail", "Finish", "Invalid",
           "InvalidKind", "Proposal", "Sleep", "SpawnChildren", "ToolCall", "WaitForInput", "WaitForSignal"]


class Decider(Protocol):
    # Pure deciders are deterministic and instant (no I/O): the executor may
    # decide the next step before Tx2 and persist it in the same checkpoint.
    pure: bool

    async def decide(self, ctx: DecisionContext) -> Proposal: ...

    async def close(self) -> None: ...
