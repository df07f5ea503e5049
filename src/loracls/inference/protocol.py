"""The serving contract: typed request and response models for every route, and every status each route
answers (so `/openapi.json` documents them all). The shapes are vLLM's (`/classify`, `/tokenize` with a
`prompt`, `/detokenize`, `/v1/models`) and text-embeddings-inference's (`/predict`, POST `/` as the Hugging Face
Inference API answers text classification (what huggingface_hub's `InferenceClient(url)` calls), `/tokenize`
with `inputs`, `/decode`, `/info`, and its error body `{"error", "error_type"}` with TEI's codes).

Statuses (error_type):
- 404 (NotFound): an unknown route, or a `model` that is not served (`/classify`'s field; `/predict`'s and
  `/info`'s `model` query or `X-Model` header)
- 405 (MethodNotAllowed): a known route with another method
- 413 (Validation): a body over `--max-body-bytes`; more texts than `--max-client-batch-size` or than the
  queue can ever hold; a text over max_length with `"truncate": false`
- 422 (Validation): a body that is not the route's JSON: no text, an empty text, a wrong type, text that is
  not valid Unicode
- 429 (Overloaded): the queue is full now (with `Retry-After`): retrying later succeeds
- 500 (Backend): the model failed on a batch; the server keeps serving
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = [
    "ClassifyRequest",
    "ClassifyResponse",
    "ClassifyItem",
    "Usage",
    "PredictRequest",
    "LabelScore",
    "ErrorResponse",
    "HealthResponse",
    "InfoResponse",
    "ModelCard",
    "ModelList",
    "ERRORS",
    "check_texts",
    "RootRequest",
    "TaskParameters",
    "TeiTokenizeRequest",
    "VllmTokenizeRequest",
    "VllmTokenizeResponse",
    "SimpleToken",
    "DecodeRequest",
    "DetokenizeRequest",
    "DetokenizeResponse",
    "TeiModelType",
]

TextOrTexts = str | list[str]


class Strict(BaseModel):
    """A request model that refuses a field it does not know (422 naming it): a field accepted and silently
    dropped would let a client believe it got what it asked for (vLLM's `use_activation: false` once still
    gave probabilities)."""

    model_config = ConfigDict(extra="forbid")


def check_texts(value: TextOrTexts) -> TextOrTexts:
    """At least one text; none empty; each valid Unicode (a lone surrogate such as "\\ud800" in JSON is not)."""
    texts = [value] if isinstance(value, str) else value
    if not texts:
        raise ValueError("no text given")
    for i, text in enumerate(texts):
        if not text.strip():
            raise ValueError(f"text {i} is empty")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"text {i} is not valid Unicode (a lone surrogate at character {exc.start})") from None
    return value


class ClassifyRequest(Strict):
    """vLLM's classification request."""

    model: str | None = Field(
        None, description="the run to ask, by name (`GET /v1/models`); none: the first served; another name is a 404"
    )
    input: TextOrTexts = Field(description="one text or a list of texts")
    top_k: int | None = Field(
        None, ge=1, description="each item also lists its k most probable labels (`top`); below 1 is a 422"
    )
    use_activation: bool | None = Field(
        None, description="vLLM's: false gives the raw logits in `probs`; unset or true the calibrated probabilities"
    )
    truncate_prompt_tokens: int | None = Field(
        None,
        ge=-1,
        description="vLLM's: keep only the last N tokens of each prompt (its special tokens kept); -1 or unset: "
        "the run's max_length, cut as in training",
    )
    user: str | None = Field(None, description="vLLM's / OpenAI's end-user id: accepted, not used")
    request_id: str | None = Field(None, description="vLLM's: accepted, not used")

    _texts = field_validator("input")(classmethod(lambda cls, value: check_texts(value)))


class PredictRequest(Strict):
    """text-embeddings-inference's /predict request."""

    inputs: TextOrTexts = Field(description="one text or a list of texts")
    raw_scores: bool = Field(False, description="logits instead of calibrated probabilities")
    truncate: bool | None = Field(
        None,
        description="false: a text over max_length is a 413; unset or true: "
        "truncated as in training (TEI's default is false)",
    )
    top_k: int | None = Field(None, ge=1, description="only the k most probable labels; below 1 is a 422")
    truncation_direction: Literal["Left", "Right", "left", "right"] = Field(
        "Right", description="TEI's: with truncation, which end of a long text is cut (Left keeps its end)"
    )

    _texts = field_validator("inputs")(classmethod(lambda cls, value: check_texts(value)))


class TaskParameters(Strict):
    """The Hugging Face Inference API's text-classification parameters (huggingface_hub sends them)."""

    top_k: int | None = Field(None, ge=1, description="only the k most probable labels; below 1 is a 422")
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = Field(
        None, description='"none": raw scores (logits); otherwise the calibrated probabilities (the model\'s own)'
    )


class RootRequest(PredictRequest):
    """POST `/`: TEI's /predict request, plus the Inference API's `parameters` (huggingface_hub's
    `text_classification`)."""

    parameters: TaskParameters | None = None


class TeiTokenizeRequest(Strict):
    """TEI's /tokenize request."""

    inputs: TextOrTexts = Field(description="one text or a list of texts")
    add_special_tokens: bool = Field(True, description="the tokenizer's special tokens (BOS) as the model reads them")
    prompt_name: None = Field(None, description="TEI's prompt names: none here")

    _texts = field_validator("inputs")(check_texts)


class VllmTokenizeRequest(Strict):
    """vLLM's /tokenize request (completions form)."""

    prompt: str = Field(description="the text")
    model: str | None = Field(None, description="the run whose tokenizer counts (`GET /v1/models`); none: the first")
    add_special_tokens: bool = True
    return_token_strs: bool = Field(False, description="vLLM's: also each token as its string (`token_strs`)")

    @field_validator("prompt")
    @classmethod
    def _unicode(cls, value: str) -> str:
        """Valid Unicode (a lone surrogate such as "\\udfff" is a 422, as TEI's shape of the route answers)."""
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(f"prompt is not valid Unicode (a lone surrogate at character {exc.start})") from None
        return value


class SimpleToken(BaseModel):
    id: int
    text: str
    special: bool
    start: int | None = Field(description="the token's first character in the text (None: a special token)")
    stop: int | None


class VllmTokenizeResponse(BaseModel):
    count: int
    max_model_len: int = Field(description="the run's max_length: longer texts are cut or windowed (long_text)")
    tokens: list[int]
    token_strs: list[str] | None = None


class DecodeRequest(Strict):
    """TEI's /decode request: token ids (one sequence or several) back to text."""

    ids: list[int] | list[list[int]]
    skip_special_tokens: bool = True


class DetokenizeRequest(Strict):
    """vLLM's /detokenize request."""

    tokens: list[int]
    model: str | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class TeiModelType(BaseModel):
    classifier: dict[str, dict] = Field(description="TEI's {id2label, label2id}")


class GenerateRequest(Strict):
    """/generate (label_and_comment runs): texts in, label and comment out."""

    inputs: TextOrTexts = Field(description="one text or a list of texts")
    model: str | None = Field(
        None, description="the run to ask, by name (`GET /v1/models`); none: the first served; another name is a 404"
    )

    _texts = field_validator("inputs")(classmethod(lambda cls, value: check_texts(value)))


class Generated(BaseModel):
    label: str = Field(description="the label scored most probable after the prompt (never sampled)")
    probabilities: dict[str, float] = Field(description="calibrated probability of every label")
    comment: str = Field(description="the comment generated after the label (greedy, at most max_comment_tokens)")


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyItem(BaseModel):
    index: int
    label: str = Field(description="the most probable label")
    probs: list[float] = Field(description="calibrated probabilities in label order (multi_label: per-label sigmoids)")
    num_classes: int
    labels: list[str] | None = Field(None, description="multi_label only: every label at or above its threshold")
    comment: str | None = Field(None, description="label_and_comment only: the comment written after the label")
    top: list[LabelScore] | None = Field(None, description="with `top_k`: the k most probable labels, best first")


class Usage(BaseModel):
    prompt_tokens: int
    total_tokens: int
    completion_tokens: int = 0
    prompt_tokens_details: None = None
    max_length: int
    long_text: str
    long_inputs: int = Field(description="texts longer than max_length")
    truncated_inputs: int = Field(description="texts cut to fit (0 under long_text: chunks)")


class ClassifyResponse(BaseModel):
    id: str
    object: Literal["list"] = "list"
    created: int
    model: str
    data: list[ClassifyItem]
    usage: Usage


class ErrorResponse(BaseModel):
    """Every error's body, in text-embeddings-inference's shape."""

    error: str
    error_type: Literal["NotFound", "MethodNotAllowed", "Validation", "Overloaded", "Backend"]


class HealthResponse(BaseModel):
    status: Literal["ok"] = "ok"


class ModelCard(BaseModel):
    """One served run, as vLLM and OpenAI list models."""

    id: str = Field(description="the run's name: the `model` a request gives")
    object: Literal["model"] = "model"
    created: int = Field(description="when the server loaded it (Unix seconds)")
    owned_by: str = "loracls"
    root: str = Field(description="what it was loaded from")


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class InfoResponse(BaseModel):
    # TEI's /info fields (its clients read these)
    model_id: str = Field(description="TEI: where the model was loaded from")
    model_sha: str | None = None
    model_dtype: str = Field(description="TEI: the compute precision")
    model_type: TeiModelType
    max_concurrent_requests: int = Field(description="TEI: texts the queue holds")
    max_input_length: int = Field(description="TEI: tokens a text is read up to (the run's max_length)")
    max_batch_tokens: int = Field(description="TEI: padded tokens of one forward pass at most")
    max_batch_requests: int | None = Field(description="TEI: texts of one forward pass at most")
    auto_truncate: bool = Field(description="TEI: longer texts are cut (or windowed under long_text: chunks)")
    tokenization_workers: int = 1
    version: str
    sha: str | None = None
    docker_label: str | None = None
    # loracls' own
    model: str
    models: list[str] = Field(description="every run this server serves (several: one base, LoRA unmerged)")
    source: str
    labels: list[str]
    max_length: int
    input_template: str | None
    problem: str
    temperature: float | None
    thresholds: list[float] | None
    long_text: str
    precision: str
    device: str
    max_batch_size: int
    max_client_batch_size: int
    max_wait_ms: float
    max_queue: int


def _documented(*codes: int) -> dict:
    described = {
        404: "unknown route, or another model's name",
        413: "too large",
        422: "not the route's JSON",
        429: "queue full now; retry after Retry-After seconds",
        500: "the model failed on this batch",
    }
    return {code: {"model": ErrorResponse, "description": described[code]} for code in codes}


ERRORS = {
    "classify": _documented(404, 413, 422, 429, 500),
    "predict": _documented(404, 413, 422, 429, 500),
    "info": _documented(404),
    "generate": _documented(404, 413, 422, 429, 500),
    "root": _documented(404, 413, 422, 429, 500),
    "tokenize": _documented(404, 413, 422),
}
