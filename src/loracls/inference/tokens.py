"""`loracls serve`'s tokenizer routes, so a client can count tokens against `max_input_length` before sending:

- `POST /tokenize` with TEI's body `{"inputs": str | [str], "add_special_tokens"}` -> a list of token lists
  (`{"id", "text", "special", "start", "stop"}`, offsets into the text), or with vLLM's body `{"prompt",
  "model", "add_special_tokens"}` -> `{"count", "max_model_len", "tokens"}`
- `POST /decode` (TEI): `{"ids": [int] | [[int]], "skip_special_tokens"}` -> a list of texts
- `POST /detokenize` (vLLM): `{"tokens": [int], "model"}` -> `{"prompt"}`

The tokenizer is the served run's (TEI's `model` query or `X-Model` header, vLLM's `model` field; none: the
first run); the text is tokenized as given (the run's input template is not applied).
"""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Header, Query, Request

from loracls.inference.protocol import (
    ERRORS,
    DecodeRequest,
    DetokenizeRequest,
    DetokenizeResponse,
    SimpleToken,
    TeiTokenizeRequest,
    VllmTokenizeRequest,
    VllmTokenizeResponse,
)
from loracls.inference.served import Serving

__all__ = ["router", "BadTokenIds"]

router = APIRouter()


class BadTokenIds(Exception):
    """/decode or /detokenize with an id outside the tokenizer's vocabulary (HTTP 422)."""


MODEL_QUERY = Query(None, description="the run whose tokenizer is used; none: the first served")
MODEL_HEADER = Header(None, description="the same as the `model` query")


def _tokens(tokenizer, text: str, add_special_tokens: bool) -> list[SimpleToken]:
    encoded = tokenizer(text, add_special_tokens=add_special_tokens, return_offsets_mapping=True)
    special = set(tokenizer.all_special_ids)
    out = []
    for token_id, (start, stop) in zip(encoded["input_ids"], encoded["offset_mapping"]):
        is_special = token_id in special and start == stop
        piece = tokenizer.convert_ids_to_tokens(token_id) if is_special else text[start:stop]
        out.append(
            SimpleToken(
                id=token_id,
                text=piece,
                special=is_special,
                start=None if is_special else start,
                stop=None if is_special else stop,
            )
        )
    return out


@router.post("/tokenize", responses=ERRORS["tokenize"])
async def tokenize(
    body: TeiTokenizeRequest | VllmTokenizeRequest,
    request: Request,
    model: str | None = MODEL_QUERY,
    x_model: str | None = MODEL_HEADER,
) -> list[list[SimpleToken]] | VllmTokenizeResponse:
    serving = Serving(request)
    if isinstance(body, VllmTokenizeRequest):
        run = serving.served.pick(body.model or model or x_model)
        encoded = await asyncio.to_thread(run.tokenizer, body.prompt, add_special_tokens=body.add_special_tokens)
        ids = encoded["input_ids"]
        strs = run.tokenizer.convert_ids_to_tokens(ids) if body.return_token_strs else None
        return VllmTokenizeResponse(count=len(ids), max_model_len=run.max_length, tokens=ids, token_strs=strs)
    run = serving.served.pick(model or x_model)
    texts = serving.texts(body.inputs)
    # off the event loop: megabytes of text take seconds to tokenize, and /health must answer meanwhile
    return await asyncio.to_thread(lambda: [_tokens(run.tokenizer, text, body.add_special_tokens) for text in texts])


@router.post("/decode", responses=ERRORS["tokenize"])
async def decode(
    body: DecodeRequest, request: Request, model: str | None = MODEL_QUERY, x_model: str | None = MODEL_HEADER
) -> list[str]:
    serving = Serving(request)
    run = serving.served.pick(model or x_model)
    sequences = _checked(run.tokenizer, body.ids if body.ids and isinstance(body.ids[0], list) else [body.ids])
    return [run.tokenizer.decode(ids, skip_special_tokens=body.skip_special_tokens) for ids in sequences]


@router.post("/detokenize", responses=ERRORS["tokenize"])
async def detokenize(body: DetokenizeRequest, request: Request) -> DetokenizeResponse:
    run = Serving(request).served.pick(body.model)
    return DetokenizeResponse(prompt=run.tokenizer.decode(_checked(run.tokenizer, [body.tokens])[0]))


def _checked(tokenizer, sequences: list[list[int]]) -> list[list[int]]:
    size = len(tokenizer)
    for n, ids in enumerate(sequences):
        wrong = next((i for i in ids if not 0 <= i < size), None)
        if wrong is not None:
            raise BadTokenIds(f"ids {n}: {wrong} is not a token id of this tokenizer (0..{size - 1})")
    return sequences
