"""The stand-in model's hidden states name their tokens, so ``compute_logits`` gives any row
its logits: the batch's logit rows as the harness names them, and the prompt positions
``PromptLogprobsWorker`` asks for (``hidden_states[:num_tokens]``, in chunks).

    hidden state of a token    [1, slot, position, 0 ...] float32 (padding: zeros)
    the batch's logit rows     the first call with as many rows: trace_logits, as before
    any other row, (r, p)      spread_logits(r, p) when r is spread (SpreadRows.requests),
                               else 0 at synth_token(r, p + 1), -inf elsewhere (the token rule)

PCP: the all-gather stand-in (``platform.OneProcessGroup``) takes each rank's own share
(``rank_shares``: a peer's tokens named from its own local batch), so vLLM's restore order
decides which row is which. A FULL replay returns the graph's output buffer: it is named
for each forward's batch before the replay, as a GPU replay writes it.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from simrig.sampling.logits import spread_logits
from simrig.step import synth_token

NAMED, SLOT, POSITION = 0, 1, 2  # the hidden-state columns that name a token


class SpreadRows(dict):
    """row -> spread logits of the batch's logit rows, and the spread requests among them."""

    def __init__(self, rows: dict[int, np.ndarray], requests: set[str]) -> None:
        super().__init__(rows)
        self.requests = requests


def target_tokens(batch: Any) -> np.ndarray:
    """The trace's token for every logit row of ``batch`` (the global batch:
    sampling runs on it, PCP restores it first), in logits order. # [num_logits]"""
    n = batch.num_reqs
    num_logits = np.diff(batch.cu_num_logits_np[: n + 1])
    seq_lens = batch.seq_lens[:n].cpu().numpy()
    tokens: list[int] = []
    for i, req_id in enumerate(batch.req_ids):
        first = int(seq_lens[i]) - int(num_logits[i]) + 1
        tokens.extend(synth_token(req_id, first + j) for j in range(int(num_logits[i])))
    return np.asarray(tokens, dtype=np.int64)


def trace_logits(torch: Any, tokens: np.ndarray, vocab_size: int, num_rows: int, device: Any,
                 spread: dict[int, np.ndarray] | None = None) -> Any:
    """Logits whose only finite entry in row j is ``tokens[j]`` (0 there), but for the
    rows of ``spread`` (``simrig.sampling.logits``)."""
    logits = torch.full((num_rows, vocab_size), float("-inf"), device=device)
    if num_rows:
        logits[torch.arange(num_rows), torch.from_numpy(tokens).to(device)] = 0.0
    for row, values in (spread or {}).items():
        logits[row] = torch.from_numpy(values).to(device)
    return logits


def token_names(batch: Any, num_rows: int) -> np.ndarray:
    """Each of ``batch``'s tokens as [1, its request's slot, its position]; padding rows
    zeros. # [num_rows, 3] float32 (exact below 2**24)"""
    out = np.zeros((num_rows, 3), dtype=np.float32)
    n = batch.num_reqs
    starts = np.asarray(batch.query_start_loc_np[: n + 1], dtype=np.int64)
    slots = np.repeat(np.asarray(batch.idx_mapping_np[:n], dtype=np.int64), np.diff(starts))
    k = min(len(slots), num_rows)
    out[:k, NAMED] = 1.0
    out[:k, SLOT] = slots[:k]
    out[:k, POSITION] = batch.positions[:k].cpu().numpy()
    return out


class TokenNames:
    """Per runner: names the forward's tokens and gives any named row its logits."""

    def __init__(self, torch: Any, device: Any, hidden_size: int, runner: Any = None) -> None:
        self._torch, self._device, self.hidden_size = torch, device, hidden_size
        self.runner = runner  # its cudagraph manager (FULL buffer) and PCP manager
        self.peers: list[Any] = []  # the PCP managers of ranks past 0 (the runner's parts)
        self.batch: Any = None  # the forward in flight (model_state.prepare_inputs)
        self.req_states: Any = None
        self._served: Any = None  # the target tokens whose logit rows were served

    def on_inputs(self, batch: Any, req_states: Any) -> None:
        """The forward's batch (this rank's); a FULL graph's output buffer named for it."""
        self.batch, self.req_states = batch, req_states
        buffer = getattr(getattr(self.runner, "cudagraph_manager", None), "hidden_states", None)
        if buffer is not None and buffer.dim() == 2 and buffer.shape[1] >= 3:
            buffer.zero_()
            buffer[:, :3] = self._torch.from_numpy(token_names(batch, buffer.shape[0])).to(buffer)

    def hidden_states(self, num_tokens: int) -> Any:
        """The forward's output: its tokens named (zeros without a batch). Under PCP the
        tensor carries each rank's share for the all-gather stand-in."""
        torch = self._torch
        out = torch.zeros(num_tokens, self.hidden_size, dtype=torch.float32, device=self._device)
        if self.batch is None:
            return out
        out[:, :3] = torch.from_numpy(token_names(self.batch, num_tokens)).to(self._device)
        if self.peers:
            out.rank_shares = lambda: [out, *(self._peer_share(m, out) for m in self.peers)]
        return out

    def _peer_share(self, manager: Any, own: Any) -> Any:
        """A PCP peer's hidden states, named from its local batch of this step (a peer that
        did not partition this step's batch: this rank's share, as before)."""
        mine = getattr(getattr(self.runner, "pcp_manager", None), "_global_batch", None)
        local = getattr(manager, "_local_batch", None)
        if local is None or mine is None or getattr(manager, "_global_batch", None) is not mine:
            return own
        share = self._torch.zeros_like(own)
        share[:, :3] = self._torch.from_numpy(token_names(local, own.shape[0])).to(own)
        return share

    def logits(self, hidden_states: Any, tokens: np.ndarray | None, vocab_size: int,
               spread: dict[int, np.ndarray] | None) -> Any:
        """``compute_logits``: zeros in a dummy or profile run (no tokens named); the batch's
        logit rows the first time as many rows are asked; any other rows by their names."""
        torch, num_rows = self._torch, hidden_states.shape[0]
        if tokens is None:
            return torch.zeros((num_rows, vocab_size), device=self._device)
        if self._served is not tokens and num_rows == len(tokens):
            self._served = tokens
            return trace_logits(torch, tokens, vocab_size, num_rows, self._device, spread)
        names = hidden_states[:, :3].detach().cpu().numpy()
        slot_to_req = getattr(self.req_states, "index_to_req_id", {})
        spread_reqs = getattr(spread, "requests", set())
        rows = np.zeros((num_rows, vocab_size), dtype=np.float32)
        for j, (named, slot, pos) in enumerate(names):
            req_id = slot_to_req.get(int(slot)) if named == 1.0 else None
            if req_id is None:
                continue  # padding: a row no prompt logprob reads
            if req_id in spread_reqs:
                rows[j] = spread_logits(req_id, int(pos), vocab_size)
            else:
                rows[j] = -np.inf
                rows[j, synth_token(req_id, int(pos) + 1)] = 0.0
        return torch.from_numpy(rows).to(self._device)
