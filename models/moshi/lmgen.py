"""moshi's `LMGen` with one change: tokens are chosen per slot (models/moshi/sampling.py).

Everything else is moshi's own streaming step (`LMGen._step`): the delayed token cache, the per-slot
offsets, `exec_mask` for slots that do not step this frame and `reset_streaming(mask)` for a session
that takes a slot. moshi chooses tokens in two places, and each is redirected here:

- the text token: `_step` calls `on_text_logits_hook(text_logits)` right before its (greedy, as built
  here) `sample_token`; the hook chooses each row's token with its session's generator and leaves the
  row's logits as 0 at that token and -inf elsewhere, so moshi's argmax takes exactly that token;
- the audio tokens: `depformer_step` (a method, which `_step` reaches through its CUDA-graph wrapper)
  is overridden with the same loop over the depth transformer, choosing per slot.

Greedy decoding uses neither: it is moshi's `LMGen` as shipped.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from models.moshi.runtime import import_moshi
from models.moshi.sampling import Sampling, choose

LMGen: Any = import_moshi().models.lm.LMGen


class SlotLMGen(LMGen):  # LMGen is Any here: moshi's types are not checked
    """`LMGen` for N fixed slots whose sessions sample independently.

    `generators[slot]` is the generator of the session in that slot (None while free); the serving
    model sets it when a session opens and clears it at close.
    """

    def __init__(self, lm_model: Any, sampling: Sampling, n_slots: int, conditions: Any = None) -> None:
        """`conditions`: a conditioned LM's condition tensors, one row per slot (`Loaded.conditions`)."""
        # use_sampling=False: moshi's own sample_token becomes an argmax, which the hook below steers.
        super().__init__(lm_model, use_sampling=False, temp=sampling.temp, temp_text=sampling.temp_text,
                         top_k=sampling.top_k, top_k_text=sampling.top_k_text, support_out_of_sync=True,
                         condition_tensors=conditions)
        self.sampling = sampling
        self.generators: list[torch.Generator | None] = [None] * n_slots
        if not sampling.greedy:
            self.on_text_logits_hook = self._choose_text

    def _active(self) -> Tensor:
        state = self._streaming_state
        assert state is not None, "SlotLMGen steps only inside `streaming(n_slots)`"
        return state.exec_mask

    def _choose_text(self, text_logits: Tensor) -> None:
        """text_logits [B, 1, 1, text_card], rewritten in place so that argmax picks each row's token."""
        tokens = choose(text_logits[:, 0, 0], self._active(), self.generators, self.sampling.temp_text,
                        self.sampling.top_k_text)  # [B]
        text_logits.fill_(float("-inf"))
        text_logits[:, 0, 0].scatter_(-1, tokens[:, None], 0.0)

    def depformer_step(self, text_token: Tensor, transformer_out: Tensor) -> Tensor:
        """The audio tokens of one frame, codebook after codebook through the depth transformer.

        text_token [B], transformer_out [B, 1, dim] -> [B, dep_q]. moshi's loop, with `choose`.
        """
        lm = self.lm_model
        assert lm.depformer is not None and self.cfg_coef == 1.0, "no depth transformer, or CFG (unsupported)"
        batch = text_token.shape[0]
        active = self._active()
        greedy = self.sampling.greedy
        tokens: list[Tensor] = []
        prev = text_token
        with lm.depformer.streaming(batch):
            for cb in range(lm.dep_q):
                logits = lm.forward_depformer(cb, prev[:, None, None], transformer_out)  # [B, 1, 1, card]
                row = logits[:, 0, 0]
                prev = row.float().argmax(-1) if greedy else choose(
                    row, active, self.generators, self.sampling.temp, self.sampling.top_k)
                tokens.append(prev)
        out = torch.stack(tokens, dim=1)  # [B, dep_q]
        assert out.shape == (batch, lm.dep_q), out.shape
        return out
