"""The command line's grammar: every command, its arguments and their help (`loracls --help`); what each
command does is in cli.py. A usage mistake is a `UsageError` (one `loracls:` line, exit 2)."""

from __future__ import annotations

import argparse

__all__ = ["build_parser", "UsageError"]


def _whole(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None


def _whole_between(low: int, high: int):
    """An argparse type: a whole number from low to high."""

    def whole(text: str) -> int:
        value = _whole(text)
        if not low <= value <= high:
            raise argparse.ArgumentTypeError(f"must be between {low} and {high}, got {value}")
        return value

    return whole


MAX_AUGMENT = 100  # variants of each training text: beyond this the teacher labels millions of near-copies


def _positive(text: str) -> int:
    value = _whole(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _port(text: str) -> int:
    value = _whole(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"a TCP port is 0 (any free one) to 65535, got {value}")
    return value


def _number_between(low: float, high: float, unit: str = ""):
    """An argparse type: a number from low to high (nan refused), in `unit` where one is named."""
    of_unit, in_unit = (f" of {unit}", f" {unit}") if unit else ("", "")

    def number(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number{of_unit}, got {text!r}") from None
        if not low <= value <= high:  # also refuses nan
            raise argparse.ArgumentTypeError(f"must be between {low:g} and {high:g}{in_unit}, got {value:g}")
        return value

    return number


_fraction = _number_between(0, 64)  # GPUs a trial holds
_milliseconds = _number_between(0, 60_000, "milliseconds")


def _inference_options(parser) -> None:
    parser.add_argument("--device", help="override the run's device (auto, cpu, cuda, cuda:N, mps)")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], help="override the run's precision")
    parser.add_argument(
        "--engine",
        choices=["torch", "onnx", "onnx-int8", "ensemble", "ray"],
        default="torch",
        help="torch (default); onnx / onnx-int8: the run's ONNX export (export --format onnx [--quantize int8]) "
        "through onnxruntime on the CPU; ensemble (predict, evaluate): the verdict's ensemble row, LoRA and the "
        "run's encoder blended; ray (predict --file --out): Ray Data over a pool of torch engines",
    )


class UsageError(Exception):
    """A command line argparse refused; said in one `loracls:` line like any other bad input."""


class Parser(argparse.ArgumentParser):
    """argparse, but a refused command line is one line (argparse prints the usage block and exits)."""

    def error(self, message: str):
        command = self.prog.removeprefix("loracls").strip()
        raise UsageError(f"{command + ': ' if command else ''}{message} (see: {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="loracls", description="Small decoder LM + LoRA -> verified text classifier.")
    sub = parser.add_subparsers(dest="command", required=True)
    _job_commands(sub)
    _run_commands(sub)
    _ship_commands(sub)
    return parser


def _job_commands(sub) -> None:
    """Commands that start from a config: train, baseline, sweep, tune, and doctor."""
    p = sub.add_parser("train", help="train a classifier (no config: the embedded default job)")
    p.add_argument("config", nargs="?", help="YAML config; keys as in loracls.config.Config")
    p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--resume", metavar="RUN", help="continue an interrupted run from its last checkpoint")
    p.add_argument("--help-config", action="store_true", help="every config key: type, range, default, what it does")

    p = sub.add_parser("doctor", help="backend, versions, GPU arch vs torch build, a real matmul, bf16, bitsandbytes")

    p = sub.add_parser("baseline", help="zero-shot prompt baseline (plain and calibrated) on the test split")
    p.add_argument("config", nargs="?")
    p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE")

    p = sub.add_parser("sweep", help="train a grid of configs; one table (markdown + CSV) of the results")
    p.add_argument("config", nargs="?")
    p.add_argument("--grid", nargs="+", required=True, metavar="KEY=V1,V2", help="values to combine")
    p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    _trial_engine_options(p)

    p = sub.add_parser(
        "tune",
        help="Optuna search over training settings on one or more data sets, judged on "
        "validation only (mean over the data sets)",
    )
    p.add_argument("configs", nargs="*", help="YAML configs, one per data set (none: the embedded default job)")
    p.add_argument("--trials", type=int, default=20, help="trials in all (a rerun continues the study)")
    p.add_argument(
        "--space",
        nargs="+",
        metavar="KEY=SPEC",
        help="log:LOW:HIGH | float:LOW:HIGH | int:LOW:HIGH | "
        "V1,V2,...; default: learning_rate, r, lora_alpha, target_modules, epochs, head_init",
    )
    p.add_argument(
        "--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE", help="override a key in every config"
    )
    _trial_engine_options(p)


def _trial_engine_options(parser) -> None:
    parser.add_argument(
        "--engine",
        choices=["local", "ray"],
        default="local",
        help="local: one run after another here; ray: each run a Ray Tune trial (the ray extra)",
    )
    parser.add_argument("--address", help="--engine ray: a running cluster (auto, ray://host:10001); none: a local Ray")
    parser.add_argument("--cpus-per-trial", type=_positive, help="--engine ray: CPUs (and torch threads) a trial holds")
    parser.add_argument("--gpus-per-trial", type=_fraction, help="--engine ray: GPUs a trial holds (0.5: two a GPU)")


def _run_commands(sub) -> None:
    """Commands that read a finished run: distill, report, evaluate, predict."""
    p = sub.add_parser("distill", help="teach a small encoder the run's probabilities; it joins the run's verdict")
    p.add_argument("run")
    p.add_argument("--student", default="minilm", help="minilm (default), mpnet-base, or an HF encoder directory")
    p.add_argument(
        "--teacher",
        choices=["auto", "lora", "ensemble"],
        default="auto",
        help="whose probabilities are taught: the run's LoRA, its ensemble row (LoRA + encoder), or auto (default): "
        "the ensemble where it is the verdict's best row, else LoRA",
    )
    p.add_argument("--student-layers", type=_positive, help="keep N of the student's layers (spread evenly): cheaper")
    p.add_argument("--unlabeled", metavar="FILE", help="texts the teacher labels too (CSV/JSONL/Parquet/TXT)")
    p.add_argument("--max-unlabeled", type=int, default=10_000, help="at most N unlabeled texts (a seeded draw)")
    p.add_argument(
        "--augment",
        type=_whole_between(0, MAX_AUGMENT),
        default=0,
        metavar="K",
        help=f"K variants of each training text, taught too (0 to {MAX_AUGMENT})",
    )
    p.add_argument("--weights", default="0.5,1.0", help="the teacher's share of the loss: each tried, best kept")
    p.add_argument("--temperature", type=float, default=1.0, help="distillation temperature (> 1: softer targets)")
    p.add_argument("--learning-rate", type=float, help="default: the rate the run's encoder baseline chose")
    p.add_argument("--batch-size", type=_positive, help="the teacher's texts a forward pass")

    p = sub.add_parser("report", help="one HTML page (and PNGs) for a finished run")
    p.add_argument("run")

    p = sub.add_parser("evaluate", help="metrics of a finished run on its test split or another file")
    p.add_argument("run")
    p.add_argument("--data", help="labelled CSV/JSONL/Parquet with the run's text and label columns")
    p.add_argument("--batch-size", type=_positive, help="texts per forward pass (default: the run's eval_batch_size)")
    _inference_options(p)

    p = sub.add_parser("predict", help="predict labels with a finished run (JSONL out)")
    p.add_argument("run")
    p.add_argument("--text", action="append", help="a text to classify (repeatable)")
    p.add_argument("--file", help=".txt (one text a line) or CSV/JSONL/Parquet with the text column")
    p.add_argument(
        "--out",
        help="with --text: write JSONL here; with --file: OUT.jsonl (lines) or OUT.parquet (a directory of parts), "
        "written chunk by chunk",
    )
    p.add_argument("--resume", action="store_true", help="continue an interrupted --file IN --out OUT call")
    p.add_argument("--chunk-rows", type=_positive, default=10_000, help="rows read, scored and written at a time")
    p.add_argument("--address", help="--engine ray: the cluster to join (auto, ray://host:10001); none: a local Ray")
    p.add_argument("--workers", type=_positive, default=2, help="--engine ray: actors, each loading the model once")
    p.add_argument("--batch-size", type=_positive, help="texts per forward pass (default: the run's eval_batch_size)")
    _inference_options(p)


def _ship_commands(sub) -> None:
    """Commands that ship a finished run: serve, export, modules."""
    p = sub.add_parser("serve", help="serve a run over HTTP (vLLM /classify and TEI /predict shapes)")
    p.add_argument(
        "run",
        nargs="+",
        help="a finished run directory or a merged model directory; several runs on one base model: the base "
        "is loaded once and each run's LoRA and head unmerged (requests pick one by its `model` name)",
    )
    p.add_argument("--host", default="127.0.0.1", help="the address to listen on (0.0.0.0: every IPv4 interface)")
    p.add_argument("--port", type=_port, default=8000, help="0: any free port (the one taken is printed)")
    p.add_argument("--max-batch-size", type=_positive, default=64, help="texts per forward pass")
    p.add_argument(
        "--max-wait-ms", type=_milliseconds, default=5.0, help="how long the first text waits for others (0-60000 ms)"
    )
    p.add_argument("--max-queue", type=_positive, default=4096, help="texts queued before 429 + Retry-After")
    p.add_argument(
        "--max-client-batch-size",
        type=_positive,
        default=32,
        help="texts in one request at most (TEI's name and default); more get 413",
    )
    p.add_argument("--max-body-bytes", type=_positive, default=4 * 2**20, help="larger request bodies get 413")
    p.add_argument(
        "--max-connections",
        type=_positive,
        help="open connections at most; at the limit the oldest that has sent nothing is closed (default: the "
        "open-file limit less 64)",
    )
    p.add_argument(
        "--header-timeout",
        type=_number_between(0.1, 3600, "seconds"),
        default=10.0,
        help="a connection that sends nothing for this many seconds is closed (default 10)",
    )
    _inference_options(p)

    p = sub.add_parser("export", help="export a run: ONNX (checked with onnxruntime) or the merged model again")
    p.add_argument("run")
    p.add_argument("--format", choices=["onnx", "merged"], required=True)
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="fp32", help="merged weights (bf16: half the size)")
    p.add_argument("--out", help="onnx: the folder to write (default RUN/onnx)")
    p.add_argument(
        "--quantize",
        choices=["int8"],
        help="onnx: also write model.int8.onnx (int8 weight blocks, onnxruntime MatMulNBits), checked against fp32",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="onnx: replace an existing export (written whole, then swapped in: a failed export keeps the old one)",
    )

    p = sub.add_parser("modules", help="list a model's LoRA-able modules and what patterns match")
    p.add_argument("model", help="HF directory, .gguf, hub id, or embedded:gemma3-270m")
    p.add_argument("--pattern", action="append", help="target pattern to try (repeatable)")
