"""`loracls` command line. Bad input: one line on stderr, exit code 2, nothing half-written."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path

from loracls.errors import LoraclsError, capped, first_line, quiet

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 1


def log(message: str) -> None:
    """Progress lines on stderr (stdout stays clean for JSON); tqdm.write keeps the progress bar intact."""
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def cmd_train(args) -> None:
    from loracls.config_reader import config_help, load_config
    from loracls.jobs.train import train

    if args.help_config:
        print(config_help(), end="")
        return
    if args.resume:
        if args.config or args.set:
            raise LoraclsError("--resume takes the run's own config; give no CONFIG or --set with it")
        train(None, log, resume=args.resume)
        return
    train(load_config(args.config, args.set), log)


def cmd_evaluate(args) -> None:
    from loracls.files import json_line
    from loracls.inference.loaded import evaluate
    from loracls.runs import to_dict

    print(json_line(to_dict(evaluate(args.run, args.data, _engine_options(args), log))))


def cmd_predict(args) -> None:
    from loracls import files, runs
    from loracls.inference.loaded import predict, predictor
    from loracls.inference.streaming import FileJob, predict_file, stream_to_stdout

    if bool(args.text) == bool(args.file):
        raise LoraclsError("predict: give --text (repeatable) or --file, not both")
    if args.resume and not (args.file and args.out):
        raise LoraclsError("predict: --resume continues an interrupted --file IN --out OUT call; give both")
    if args.engine == "ray":
        return _predict_with_ray(args)
    if args.text:
        rows = predict(args.run, args.text, _engine_options(args), log)
        if args.out:
            files.write_jsonl(Path(args.out), rows)  # atomically: a failed run leaves no half-written file
        else:
            sys.stdout.write("".join(files.json_line(row) + "\n" for row in rows))
        return
    run = runs.owning_run(runs.check_model_dir(args.run))
    text_column = runs.read_config(run).text_column if run is not None else "text"

    def make_score():  # called once the input file (and the output) are checked
        return predictor(args.run, _engine_options(args), log)

    if args.out:
        predict_file(make_score, FileJob(args.run, args.file, args.out, text_column), args.chunk_rows, args.resume, log)
    else:
        stream_to_stdout(make_score, args.file, text_column, args.chunk_rows)


def _predict_with_ray(args) -> None:
    from loracls import runs
    from loracls.inference.ray_predict import predict_with_ray
    from loracls.inference.streaming import FileJob

    if not (args.file and args.out) or args.resume:
        raise LoraclsError("predict --engine ray: give --file IN and --out DIR (no --resume: Ray retries failed tasks)")
    text_column = runs.read_config(runs.check_run_dir(args.run)).text_column
    job = FileJob(args.run, args.file, args.out, text_column)
    predict_with_ray(job, args.address, args.workers, args.chunk_rows, args.batch_size, log)


def cmd_serve(args) -> None:
    from loracls import runs
    from loracls.inference.loaded import engine_for
    from loracls.inference.server import ServeLimits, serve

    if len(args.run) > 1 and any(runs.owning_run(Path(p)) != Path(p) for p in args.run):
        from loracls.inference.group import EngineGroup  # exported models (a student) beside runs: side by side

        classifier = EngineGroup([engine_for(p, _engine_options(args, args.max_batch_size), log) for p in args.run])
    elif len(args.run) > 1:  # several runs on one base: the base loaded once, each run's LoRA unmerged
        from loracls.inference.adapters import AdapterSet

        if args.engine != "torch":
            raise LoraclsError(f"serve: several runs are served by --engine torch, not {args.engine}")
        classifier = AdapterSet(args.run, log, args.max_batch_size, args.device, args.precision)
    else:  # a run directory or a merged model directory; label_and_comment: labels scored, comments written
        classifier = engine_for(args.run[0], _engine_options(args, args.max_batch_size), log)
    limits = ServeLimits(
        args.max_batch_size, args.max_wait_ms, args.max_queue, args.max_body_bytes, args.max_client_batch_size
    )
    serve(classifier, args.host, args.port, limits, log)


def cmd_export(args) -> None:
    from loracls import runs
    from loracls.files import json_line

    if args.format == "onnx" and args.dtype != "fp32":
        raise LoraclsError("export --format onnx writes fp32 (checked against PyTorch in fp32); drop --dtype")
    if args.quantize and args.format != "onnx":
        raise LoraclsError("export --quantize int8 applies to --format onnx")
    if args.format == "merged" and args.out:
        raise LoraclsError("export --format merged writes RUN/merged; --out is for onnx")
    model = runs.check_model_dir(args.run)
    if args.format == "merged" or runs.owning_run(model) is None:  # a model folder's test split is its run's
        runs.check_run_dir(args.run)
    with runs.hold(runs.owning_run(model)):  # one writer per run directory
        if args.format == "onnx":
            from loracls.inference.onnx_export import export_onnx

            for check in export_onnx(args.run, args.out, log, replace=args.force, quantize=args.quantize):
                print(json_line(runs.to_dict(check)))
            return _write_cards(model)
        from loracls.inference.export import remerge

        print(json_line(runs.to_dict(remerge(args.run, args.dtype, log))))
    _write_cards(model)


def _write_cards(model: Path) -> None:
    from loracls import runs
    from loracls.inference.model_card import write_cards

    run = runs.owning_run(model)
    if run is not None and (run / runs.METRICS).is_file():
        write_cards(run)


def cmd_modules(args) -> None:
    import torch

    from loracls.model.checkpoint import read_decoder
    from loracls.model.classifier import classifier_class
    from loracls.model.lora import default_targets, match_targets, module_summary
    from loracls.model.source import resolve_model_dir

    checkpoint = read_decoder(resolve_model_dir(args.model, log))  # refuses a checkpoint train would refuse
    config = checkpoint.config
    config.num_labels = 2
    with torch.device("meta"):
        model = classifier_class(config, wrapped=checkpoint.wrapped)(config)
    if checkpoint.describe():
        print(checkpoint.describe() + "\n")
    for name, description, count in module_summary(model):
        print(f"{name:<48} {description:<28} x{count}")
    print(f"\ntarget_modules: null (the default) takes {default_targets(model, quiet)}")
    parameters = sum(p.numel() for p in model.parameters())
    print(
        f"decoder + head: {parameters / 1e6:,.1f}M parameters, {2 * parameters / 2**30:.2f} GiB in bf16 "
        f"(training with LoRA adds the activations of a micro-batch, the adapters and their AdamW state)"
    )
    for pattern in args.pattern or []:
        matched = match_targets(model, [pattern])
        print(f"\npattern {pattern!r} matches {len(matched)} module(s)" + (":" if matched else ""))
        for name in matched:
            print(f"  {name}")


def cmd_doctor(args) -> int:
    from loracls.diagnostics.doctor import doctor

    return doctor(log=print)


def cmd_baseline(args) -> None:
    from loracls.config_reader import load_config
    from loracls.files import json_line
    from loracls.jobs.train import baseline

    print(json_line(baseline(load_config(args.config, args.set), log)))


def cmd_sweep(args) -> None:
    from loracls.config_reader import load_config
    from loracls.diagnostics.sweep import parse_grid, run_sweep
    from loracls.jobs.train import train

    grid = parse_grid(args.grid)
    print(run_sweep(load_config(args.config, args.set), grid, train, log, _ray_options(args)))


def cmd_tune(args) -> None:
    from loracls.config_reader import load_config
    from loracls.jobs.train import train
    from loracls.jobs.tune import Tuning, parse_space, run_tune

    if args.trials < 1:
        raise LoraclsError("tune: --trials must be >= 1")
    configs = args.configs or [None]
    names = [Path(c).stem if c else "default" for c in configs]
    if len(set(names)) != len(names):
        raise LoraclsError(f"tune: config files need distinct names, got {', '.join(names)}")
    bases = [load_config(c, args.set) for c in configs]
    dims = parse_space(args.space)
    print(run_tune(Tuning.of(bases, names, dims, train, log), args.trials, _ray_options(args)))


def _ray_options(args):
    """RayOptions for --engine ray (None: trials run here, one after another)."""
    from loracls.jobs.ray_trials import RayOptions

    if args.engine != "ray":
        if args.address or args.cpus_per_trial or args.gpus_per_trial:
            raise LoraclsError(f"{args.command}: --address, --cpus-per-trial and --gpus-per-trial go with --engine ray")
        return None
    import importlib.util

    if importlib.util.find_spec("ray") is None:  # said before anything is written
        raise LoraclsError(f"{args.command} --engine ray needs the ray extra: pip install 'loracls[ray]'")
    return RayOptions(args.address, args.cpus_per_trial or 1, args.gpus_per_trial or 0)


def cmd_distill(args) -> None:
    from loracls import runs
    from loracls.diagnostics.report import REPORT, write_report
    from loracls.jobs.distill import DistillOptions, distill

    options = DistillOptions(
        student=args.student,
        unlabeled=args.unlabeled,
        max_unlabeled=args.max_unlabeled,
        weights=tuple(_numbers(args.weights, "--weights")),
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
    )
    distill(args.run, options, log)
    if (Path(args.run) / REPORT).is_file():  # the report shows the verdict with the student's row
        write_report(args.run)
    print(Path(args.run) / runs.STUDENT)


def _numbers(text: str, flag: str) -> list[float]:
    try:
        return [float(part) for part in text.split(",")]
    except ValueError:
        raise LoraclsError(f"{flag}: numbers separated by commas, got {text!r}") from None


def cmd_report(args) -> None:
    from loracls import runs
    from loracls.diagnostics.report import write_report
    from loracls.training.tracking import tracking

    page = write_report(args.run)
    trackers = runs.read_config(Path(args.run)).report_to
    if trackers:  # the page and its figures join the run's tracked artifacts
        with tracking(trackers, Path(args.run), resumed=True) as tracked:
            tracked.artifacts([page, *sorted(page.parent.glob("*.png"))])
    print(page)


def _engine_options(args, batch_size: int | None = None):
    """The inference options a command line gives (`--batch-size`, `--device`, `--precision`, `--engine`)."""
    from loracls.inference.loaded import EngineOptions

    return EngineOptions(batch_size or getattr(args, "batch_size", None), args.device, args.precision, args.engine)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not 0 <= value <= 64:
        raise argparse.ArgumentTypeError(f"must be between 0 and 64, got {value:g}")
    return value


def _inference_options(parser) -> None:
    parser.add_argument("--device", help="override the run's device (auto, cpu, cuda, cuda:N, mps)")
    parser.add_argument("--precision", choices=["auto", "fp32", "bf16", "fp16"], help="override the run's precision")
    parser.add_argument(
        "--engine",
        choices=["torch", "onnx", "onnx-int8", "ray"],
        default="torch",
        help="torch (default); onnx / onnx-int8: the run's ONNX export (export --format onnx [--quantize int8]) "
        "through onnxruntime on the CPU; ray (predict --file --out): Ray Data over a pool of torch engines",
    )


class _UsageError(Exception):
    """A command line argparse refused; said in one `loracls:` line like any other bad input."""


class _Parser(argparse.ArgumentParser):
    """argparse, but a refused command line is one line (argparse prints the usage block and exits)."""

    def error(self, message: str):
        command = self.prog.removeprefix("loracls").strip()
        raise _UsageError(f"{command + ': ' if command else ''}{message} (see: {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="loracls", description="Small decoder LM + LoRA -> verified text classifier.")
    sub = parser.add_subparsers(dest="command", required=True)
    _job_commands(sub)
    _run_commands(sub)
    return parser


def _job_commands(sub) -> None:
    """Commands that start from a config: train, baseline, sweep, tune, and doctor."""
    p = sub.add_parser("train", help="train a classifier (no config: the embedded default job)")
    p.add_argument("config", nargs="?", help="YAML config; keys as in loracls.config.Config")
    p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE", help="override a config key")
    p.add_argument("--resume", metavar="RUN", help="continue an interrupted run from its last checkpoint")
    p.add_argument("--help-config", action="store_true", help="every config key: type, range, default, what it does")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("doctor", help="backend, versions, GPU arch vs torch build, a real matmul, bf16, bitsandbytes")
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("baseline", help="zero-shot prompt baseline (plain and calibrated) on the test split")
    p.add_argument("config", nargs="?")
    p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    p.set_defaults(func=cmd_baseline)

    p = sub.add_parser("sweep", help="train a grid of configs; one table (markdown + CSV) of the results")
    p.add_argument("config", nargs="?")
    p.add_argument("--grid", nargs="+", required=True, metavar="KEY=V1,V2", help="values to combine")
    p.add_argument("--set", action="extend", nargs="+", default=[], metavar="KEY=VALUE")
    _trial_engine_options(p)
    p.set_defaults(func=cmd_sweep)

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
    p.set_defaults(func=cmd_tune)


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
    """Commands that start from a finished run (or a model): report, evaluate, predict, serve, export, modules."""
    p = sub.add_parser("distill", help="teach a small encoder the run's probabilities; it joins the run's verdict")
    p.add_argument("run")
    p.add_argument("--student", default="minilm", help="minilm (default), mpnet-base, or an HF encoder directory")
    p.add_argument("--unlabeled", metavar="FILE", help="texts the teacher labels too (CSV/JSONL/Parquet/TXT)")
    p.add_argument("--max-unlabeled", type=int, default=10_000, help="at most N unlabeled texts (a seeded draw)")
    p.add_argument("--weights", default="0.5,1.0", help="the teacher's share of the loss: each tried, best kept")
    p.add_argument("--learning-rate", type=float, help="default: the rate the run's encoder baseline chose")
    p.add_argument("--batch-size", type=int, help="the teacher's texts a forward pass")
    p.set_defaults(func=cmd_distill)

    p = sub.add_parser("report", help="one HTML page (and PNGs) for a finished run")
    p.add_argument("run")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("evaluate", help="metrics of a finished run on its test split or another file")
    p.add_argument("run")
    p.add_argument("--data", help="labelled CSV/JSONL/Parquet with the run's text and label columns")
    p.add_argument("--batch-size", type=_positive, help="texts per forward pass (default: the run's eval_batch_size)")
    _inference_options(p)
    p.set_defaults(func=cmd_evaluate)

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
    p.set_defaults(func=cmd_predict)

    p = sub.add_parser("serve", help="serve a run over HTTP (vLLM /classify and TEI /predict shapes)")
    p.add_argument(
        "run",
        nargs="+",
        help="a finished run directory or a merged model directory; several runs on one base model: the base "
        "is loaded once and each run's LoRA and head unmerged (requests pick one by its `model` name)",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0: any free port (the one taken is printed)")
    p.add_argument("--max-batch-size", type=_positive, default=64, help="texts per forward pass")
    p.add_argument("--max-wait-ms", type=float, default=5.0, help="how long the first text waits for others")
    p.add_argument("--max-queue", type=_positive, default=4096, help="texts queued before 429 + Retry-After")
    p.add_argument(
        "--max-client-batch-size",
        type=_positive,
        default=32,
        help="texts in one request at most (TEI's name and default); more get 413",
    )
    p.add_argument("--max-body-bytes", type=_positive, default=4 * 2**20, help="larger request bodies get 413")
    _inference_options(p)
    p.set_defaults(func=cmd_serve)

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
    p.set_defaults(func=cmd_export)

    p = sub.add_parser("modules", help="list a model's LoRA-able modules and what patterns match")
    p.add_argument("model", help="HF directory, .gguf, hub id, or embedded:gemma3-270m")
    p.add_argument("--pattern", action="append", help="target pattern to try (repeatable)")
    p.set_defaults(func=cmd_modules)


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as exc:
        print(capped(f"loracls: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        _quiet_libraries()
        code = args.func(args)
    except LoraclsError as exc:
        print(capped(f"loracls: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("loracls: interrupted", file=sys.stderr)
        return 130
    except OSError as exc:  # the machine said no: a full disk, a folder we may not write, a missing device file
        where = f" ({exc.filename})" if exc.filename else ""
        print(f"loracls: {exc.strerror or first_line(exc)}{where}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except Exception as exc:  # a defect of ours: still one line; LORACLS_DEBUG=1 shows the traceback
        if os.environ.get("LORACLS_DEBUG"):
            raise
        print(
            f"loracls: internal error ({type(exc).__name__}: {first_line(exc, 200)}); "
            f"rerun with LORACLS_DEBUG=1 for the traceback",
            file=sys.stderr,
        )
        return EXIT_INTERNAL
    return code or 0


if __name__ == "__main__":
    sys.exit(main())
