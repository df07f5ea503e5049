"""Mean pooling: the classification head reads the mean of the decoder's last hidden states over the text's
tokens (the attention mask) instead of the last token's. transformers' heads pool the last token only, so a
mean-pooling run always uses the generic head with this forward; an export carries this class's source in its
`modeling_loracls_generic.py`, so plain transformers computes the same function."""

from __future__ import annotations

import torch
from transformers.modeling_outputs import SequenceClassifierOutputWithPast


class MeanPooling:
    """A forward for GenericForSequenceClassification subclasses: logits from the masked mean of the last
    hidden states (no loss: callers compute their own)."""

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, inputs_embeds=None, **kwargs):
        kwargs.pop("labels", None)
        kwargs.pop("past_key_values", None)
        outputs = getattr(self, self.base_model_prefix)(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            inputs_embeds=inputs_embeds,
            use_cache=False,
            **kwargs,
        )
        hidden = outputs.last_hidden_state
        if attention_mask is None:
            mask = torch.ones(hidden.shape[:2], dtype=hidden.dtype, device=hidden.device)
        else:
            mask = attention_mask.to(hidden.dtype)
        summed = (hidden * mask.unsqueeze(-1)).sum(dim=1)
        pooled = summed / mask.sum(dim=1, keepdim=True).clamp(min=1.0)
        logits = self.score(pooled)
        return SequenceClassifierOutputWithPast(logits=logits, hidden_states=outputs.hidden_states)
