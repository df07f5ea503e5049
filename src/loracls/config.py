"""One typed config: defaults = the embedded default job; YAML file + `--set key=value` overrides.

Unknown keys are refused with the nearest known name; values are checked against their declared type.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import string
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from loracls import files
from loracls.errors import LoraclsError, first_line

EMBEDDED_MODEL = "embedded:gemma3-270m"
EMBEDDED_DATA = "embedded:rotten_tomatoes"
EMBEDDED_ENCODER = "embedded:all-minilm-l6-v2"
BASELINE_NAMES = ("zero_shot", "tfidf", "encoder")


@dataclass
class Config:
    # --- data ---
    data: str = EMBEDDED_DATA  # a CSV / JSONL / Parquet file, or the embedded data set
    validation_data: str | None = None  # given splits; when absent, made from `data` with `seed`
    test_data: str | None = None
    text_column: str = "text"
    label_column: str = "label"
    labels: list[str] | None = None  # label names in id order; default: sorted names found in the data
    problem: str = "single_label"  # single_label (one label a text, softmax) | multi_label (a set, sigmoid)
    label_separator: str | None = None  # multi_label: splits a text label cell ("a|b"); lists need none
    train_size: int | None = 5000  # None: everything left after validation and test
    validation_size: int = 800
    test_size: int = 1200
    balance: bool | None = None  # made splits: equal examples per class (true) or the data's own proportions
    # (false: stratified); null: true for the embedded data set, false for yours
    allow_overlap: bool = False  # given splits sharing more than a small share of texts are refused unless true
    max_length: int = 256
    long_text: str = "truncate"  # truncate | head_tail | chunks (texts longer than max_length)
    chunk_stride: int | None = None  # chunks: tokens from one window's start to the next; null: half a window
    chunk_training: str = "all"  # chunks: train on every window (with the text's label) or on the first only
    input_template: str | None = None  # e.g. "Review: {text}\nSentiment:"; the classifier reads its last token
    seed: int = 42
    # --- model ---
    model: str = EMBEDDED_MODEL  # HF directory, hub id, .gguf file, or the embedded Gemma 3 270M
    head_init: str = "zero"  # zero | verbalizer (the zero-shot prompt's label logits at step 0) | random
    # --- LoRA (PEFT's names) ---
    r: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.05
    target_modules: list[str] = field(default_factory=lambda: ["q_proj", "v_proj"])
    # --- optimisation ---
    learning_rate: float = 2e-4
    weight_decay: float = 0.01
    batch_size: int = 16
    gradient_accumulation: int = 2
    micro_batch_size: int | None = None  # examples per forward/backward; None: whole step on CPU, batch_size on GPU
    micro_batch_tokens: int | None = None  # padded tokens per forward/backward at most (activation memory): a
    # step of long texts is cut into more passes (same gradient); None: 2048 on CPU, no cap on GPU
    epochs: int = 3
    max_steps: int | None = None  # optimizer steps; None: epochs decide
    min_steps: int | None = 100  # optimizer steps at least: a small data set repeats epochs; None: epochs decide
    warmup_steps: int = 100  # at most a quarter of all steps (a short run is not all warmup)
    scheduler: str = "cosine"
    max_grad_norm: float = 1.0
    class_weights: str | dict[str, float] = "none"  # none | balanced | {label: weight}: weights in the loss
    # --- loop and evaluation ---
    log_every: int = 10  # optimizer steps
    eval_every: int = 50  # optimizer steps
    patience: int | None = 5  # validations without improvement before stopping; None: never stop early
    select_by: str = "accuracy"  # accuracy | macro_f1 | loss: picks the best checkpoint, drives early stopping
    eval_batch_size: int = 32
    # --- hardware ---
    device: str = "auto"  # auto | cpu | cuda | cuda:N | mps
    precision: str = "auto"  # auto | fp32 | bf16 | fp16
    threads: int | None = None  # CPU threads; None: all cores
    deterministic: bool = False  # bit-for-bit repeatable GPU runs (torch's deterministic algorithms; slower)
    data_parallel: str = "ddp"  # with several processes: ddp (whole model on each) | fsdp (weights sharded, FSDP2)
    # --- output ---
    output_dir: str = "runs"
    run_name: str | None = None
    merge: bool = True  # write the merged standalone model and check it against the adapter
    merge_dtype: str = "fp32"  # fp32 | bf16 (half the size; checked at bf16's tolerance)
    # --- baselines (scored on the test split before training) ---
    baseline: bool = True  # false: no baseline at all
    baselines: list[str] = field(default_factory=lambda: ["zero_shot", "tfidf", "encoder"])  # which ones
    prompt_template: str | None = None  # must hold {text}; may hold {choices}
    verbalizers: dict[str, str] | None = None  # label name -> word scored after the prompt
    encoder_model: str = EMBEDDED_ENCODER  # the encoder baseline: HF encoder directory or hub id; default MiniLM-L6
    encoder_epochs: int = 5  # the best epoch on validation is kept
    encoder_learning_rate: float = 1e-4
    encoder_batch_size: int = 16
    # --- memory savers that need bitsandbytes on a GPU ---
    optimizer: str = "adamw"  # adamw | adamw_8bit
    quantization: str = "none"  # none | 4bit | 8bit (QLoRA)

    def validate(self) -> Config:
        for name, (low, high, low_open) in NUMBER_RANGES.items():
            _check_range(name, getattr(self, name), low, high, low_open)
        choices = {
            "precision": ("auto", "fp32", "bf16", "fp16"),
            "scheduler": ("cosine", "linear", "constant"),
            "optimizer": ("adamw", "adamw_8bit"),
            "quantization": ("none", "4bit", "8bit"),
            "data_parallel": ("ddp", "fsdp"),
            "merge_dtype": ("fp32", "bf16"),
            "select_by": ("accuracy", "macro_f1", "loss"),
            "long_text": ("truncate", "head_tail", "chunks"),
            "chunk_training": ("all", "first"),
            "head_init": ("zero", "verbalizer", "random"),
            "problem": ("single_label", "multi_label"),
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise LoraclsError(f"config: {name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not self.target_modules:
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
            raise LoraclsError(f"config: class_weights must be none, balanced or {{label: weight}}, got {weights!r}")
        if isinstance(weights, dict):
            bad = {k: v for k, v in weights.items() if not (math.isfinite(v) and v > 0)}
            if bad or not weights:
                raise LoraclsError(f"config: class_weights must map labels to finite weights > 0, got {bad or weights}")

    def _check_problem(self) -> None:
        if self.problem == "single_label":
            if self.label_separator is not None:
                raise LoraclsError("config: label_separator splits label sets: it needs problem: multi_label")
            return
        if self.label_separator == "":
            raise LoraclsError("config: label_separator must not be empty")
        if self.balance:
            raise LoraclsError(
                "config: balance: true needs one label a text; multi_label splits keep the data's "
                "proportions of label sets"
            )
        if self.head_init == "verbalizer":
            raise LoraclsError(
                "config: head_init: verbalizer reads one label word after a prompt; with "
                "problem: multi_label use zero or random"
            )

    @property
    def multi_label(self) -> bool:
        return self.problem == "multi_label"

    @property
    def balanced_splits(self) -> bool:
        if self.multi_label:
            return False
        return self.data == EMBEDDED_DATA if self.balance is None else self.balance

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# name -> (lowest, highest, lowest excluded); every number must also be finite. None: no bound.
NUMBER_RANGES = {
    "max_length": (8, None, False),
    "r": (1, None, False),
    "batch_size": (1, None, False),
    "gradient_accumulation": (1, None, False),
    "epochs": (1, None, False),
    "log_every": (1, None, False),
    "eval_every": (1, None, False),
    "eval_batch_size": (1, None, False),
    "validation_size": (1, None, False),
    "test_size": (1, None, False),
    "train_size": (1, None, False),
    "max_steps": (1, None, False),
    "min_steps": (1, None, False),
    "encoder_epochs": (1, None, False),
    "encoder_batch_size": (1, None, False),
    "encoder_learning_rate": (0.0, 10.0, True),
    "threads": (1, None, False),
    "micro_batch_size": (1, None, False),
    "micro_batch_tokens": (8, None, False),
    "patience": (1, None, False),
    "chunk_stride": (1, None, False),
    "warmup_steps": (0, None, False),
    "seed": (0, 2**32 - 1, False),
    "learning_rate": (0.0, 10.0, True),
    "lora_alpha": (0.0, None, True),
    "lora_dropout": (0.0, 0.999, False),
    "weight_decay": (0.0, None, False),
    "max_grad_norm": (0.0, None, False),
}
SAFE_NAME = re.compile(r"[^/\\\x00]+")


def _check_range(name: str, value, low, high, low_open: bool) -> None:
    if value is None:
        return
    if isinstance(value, float) and not math.isfinite(value):
        raise LoraclsError(f"config: {name} must be a finite number, got {value}")
    too_low = low is not None and (value <= low if low_open else value < low)
    if too_low or (high is not None and value > high):
        bound = [f"> {low}" if low_open else f">= {low}"] if low is not None else []
        bound += [f"<= {high}"] if high is not None else []
        optional = " or null" if type(None) in typing.get_args(_TYPES[name]) else ""
        raise LoraclsError(f"config: {name} must be {' and '.join(bound)}{optional}, got {value}")


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


def check_run_name(name: str) -> str:
    """A run name is one folder inside output_dir: no path separators, not '.' or '..'."""
    if not SAFE_NAME.fullmatch(name) or name in (".", "..") or name != name.strip():
        raise LoraclsError(
            f"config: run_name {name!r} must be a plain folder name (no '/', '\\', '..' or "
            f"surrounding spaces): it is made inside output_dir"
        )
    return name


FIELDS = {f.name: f for f in dataclasses.fields(Config)}
_TYPES = typing.get_type_hints(Config)


def _nearest(key: str) -> str:
    close = difflib.get_close_matches(key, FIELDS, n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def _base_type(hint):
    """`int | None` -> int; other hints unchanged."""
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if type(None) in typing.get_args(hint) and len(args) == 1 else hint


def _coerce(key: str, value):
    """Check `value` against the declared type of `key`; ints are accepted where floats are."""
    hint = _TYPES[key]
    if value is None:
        if type(None) in typing.get_args(hint):
            return None
        raise LoraclsError(f"config: {key} cannot be null")
    return _coerce_to(key, _base_type(hint), value)


def _coerce_to(key: str, hint, value):
    arms = [a for a in typing.get_args(hint) if a is not type(None)] if isinstance(hint, types.UnionType) else []
    for arm in arms:  # `str | dict[str, float]`: the first arm the value fits
        try:
            return _coerce_to(key, arm, value)
        except LoraclsError:
            continue
    if arms:
        raise LoraclsError(f"config: {key} must be {' or '.join(_name(a) for a in arms)}, got {value!r}")
    origin = typing.get_origin(hint)
    if origin is dict:
        if not isinstance(value, dict):
            raise LoraclsError(f"config: {key} must be a mapping like {{name: value}}, got {value!r}")
        item = typing.get_args(hint)[1]
        return {str(k): _coerce_to(f"{key}.{k}", item, v) for k, v in value.items()}
    if origin is list:
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        if not isinstance(value, list) or not all(isinstance(v, (str, int, float)) for v in value):
            raise LoraclsError(f"config: {key} must be a list of names, got {value!r}")
        return [str(v) for v in value]
    return _scalar(key, hint, value)


def _scalar(key: str, base, value):
    if base is bool:
        if isinstance(value, bool):
            return value
    elif base is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif base is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):  # YAML 1.1 reads `1e-4` (no dot) as a string
            try:
                return float(value)
            except ValueError:
                pass
    elif base is str:
        if isinstance(value, (str, int, float)) and not isinstance(value, bool):
            return str(value)
    raise LoraclsError(f"config: {key} must be {_name(base)}, got {value!r}")


def _name(hint) -> str:
    return (
        getattr(hint, "__name__", None)
        if typing.get_origin(hint) is None
        else {dict: "a mapping", list: "a list"}.get(typing.get_origin(hint), str(hint))
    )


def parse_value(key: str, raw: str):
    """One command-line value: YAML scalars (`8`, `2e-4`, `null`, `[a, b]`); text keys keep their text."""
    if key in _TYPES and _base_type(_TYPES[key]) is str:  # `Review: {text}` is no mapping
        return None if raw.strip() in ("null", "~") else raw
    try:
        return yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        return raw


def split_alternatives(text: str) -> list[str]:
    """Split on commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        if char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    parts.append(current)
    return [p.strip() for p in parts if p.strip()]


def parse_overrides(pairs: list[str]) -> dict:
    """`key=value` strings -> dict of parsed values."""
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise LoraclsError(f"--set expects key=value, got {pair!r}")
        key, raw = pair.split("=", 1)
        out[key.strip()] = parse_value(key.strip(), raw)
    return out


def from_dict(values: dict, base: Config | None = None) -> Config:
    merged = dataclasses.asdict(base) if base is not None else {}
    for key, value in values.items():
        if key not in FIELDS:
            raise LoraclsError(f"config: unknown key {key!r}{_nearest(key)}")
        merged[key] = _coerce(key, value)
    return Config(**merged).validate()


def read_mapping(path: Path, what: str) -> dict:
    """A YAML file that holds a mapping of key: value (a config file, a run's config.yaml); read as UTF-8,
    anything else is one line."""
    text = files.read_text(Path(path), what)
    try:
        loaded = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise LoraclsError(f"{what} {path} is not valid YAML: {first_line(exc)}") from None
    if not isinstance(loaded, dict):
        raise LoraclsError(f"{what} {path} must hold a mapping of key: value")
    return loaded


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    config = from_dict(read_mapping(Path(path), "config file") if path is not None else {})
    return from_dict(parse_overrides(overrides or []), base=config)
