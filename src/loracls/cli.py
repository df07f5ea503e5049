"""`loracls` command line. Bad input: one line on stderr, exit code 2, nothing half-written."""

from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

from loracls.cli_parser import UsageError, build_parser
from loracls.errors import LoraclsError, capped, first_line, quiet

EXIT_BAD_INPUT = 2
EXIT_INTERNAL = 1


def log(message: str) -> None:
    """Progress lines on stderr (stdout stays clean for JSON); tqdm.write keeps the progress bar intact."""
    from tqdm import tqdm

    tqdm.write(message, file=sys.stderr)


def _progress_bars_on_a_terminal_only() -> None:
    """Progress bars redraw one line with carriage returns: on a terminal that is one moving line, in a file a
    pile of frames. Where stderr is not a terminal they are off (tqdm reads TQDM_DISABLE); the job's own log
    lines (a line every `log_every` steps, each validation) still say how far it is. LORACLS_PROGRESS=1 keeps
    them."""
    if not sys.stderr.isatty() and os.environ.get("LORACLS_PROGRESS") != "1":
        os.environ.setdefault("TQDM_DISABLE", "1")


def _quiet_libraries() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    warnings.filterwarnings("ignore")
    import transformers

    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()


def cmd_train(args) -> None:
    from loracls.config_reader import config_help, load_config, read_run_config

    if args.help_config:
        print(config_help(), end="")
        return
    if args.resume:
        if args.config or args.set:
            raise LoraclsError("--resume takes the run's own config; give no CONFIG or --set with it")
        if Path(args.resume, "config.yaml").is_file():
            read_run_config(Path(args.resume))  # a damaged config refused before torch loads
        _quiet_libraries()
        from loracls.jobs.train import train

        train(None, log, resume=args.resume)
        return
    config = load_config(args.config, args.set)  # read and checked before torch loads
    _quiet_libraries()
    from loracls.jobs.train import train

    train(config, log)


def cmd_evaluate(args) -> None:
    _run_config_first(args.run)
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
    from loracls.inference.http import bound_socket
    from loracls.inference.loaded import engine_for
    from loracls.inference.server import ServeLimits, serve

    if args.engine == "ensemble":
        raise LoraclsError(
            "serve --engine ensemble: the ensemble row is run by predict and evaluate; serve the run (LoRA) and "
            "RUN/encoder side by side: loracls serve RUN RUN/encoder"
        )
    for path in args.run:  # each one a run or an exported model, said in one line before anything loads
        runs.check_model_dir(path)
    side_by_side = len(args.run) > 1 and any(runs.owning_run(Path(p)) != Path(p) for p in args.run)
    if len(args.run) > 1 and not side_by_side and args.engine != "torch":
        raise LoraclsError(f"serve: several runs are served by --engine torch, not {args.engine}")
    sock = bound_socket(args.host, args.port)  # a taken port or an unknown host: said before the model loads
    if side_by_side:
        from loracls.inference.group import EngineGroup  # exported models (a student) beside runs: side by side

        classifier = EngineGroup([engine_for(p, _engine_options(args, args.max_batch_size), log) for p in args.run])
    elif len(args.run) > 1:  # several runs on one base: the base loaded once, each run's LoRA unmerged
        from loracls.inference.adapters import AdapterSet

        classifier = AdapterSet(args.run, log, args.max_batch_size, args.device, args.precision)
    else:  # a run directory or a merged model directory; label_and_comment: labels scored, comments written
        classifier = engine_for(args.run[0], _engine_options(args, args.max_batch_size), log)
    limits = ServeLimits(
        args.max_batch_size,
        args.max_wait_ms,
        args.max_queue,
        args.max_body_bytes,
        args.max_client_batch_size,
        args.max_connections,
        args.header_timeout,
    )
    serve(classifier, sock, limits, log)


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

    config = load_config(args.config, args.set)
    _quiet_libraries()
    from loracls.files import json_line
    from loracls.jobs.train import baseline

    print(json_line(baseline(config, log)))


def cmd_sweep(args) -> None:
    from loracls.config_reader import load_config

    config = load_config(args.config, args.set)
    _quiet_libraries()
    from loracls.diagnostics.sweep import parse_grid, run_sweep
    from loracls.jobs.train import train

    grid = parse_grid(args.grid)
    print(run_sweep(config, grid, train, log, _ray_options(args)))


def cmd_tune(args) -> None:
    from loracls.config_reader import load_config

    if args.trials < 1:
        raise LoraclsError("tune: --trials must be >= 1")
    configs = args.configs or [None]
    names = [Path(c).stem if c else "default" for c in configs]
    if len(set(names)) != len(names):
        raise LoraclsError(f"tune: config files need distinct names, got {', '.join(names)}")
    bases = [load_config(c, args.set) for c in configs]
    _quiet_libraries()
    from loracls.jobs.train import train
    from loracls.jobs.tune import Tuning, parse_space, run_tune

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
    _run_config_first(args.run)
    from loracls import runs
    from loracls.diagnostics.report import REPORT, write_report
    from loracls.jobs.distill import DistillOptions, distill

    options = DistillOptions(
        student=args.student,
        student_layers=args.student_layers,
        unlabeled=args.unlabeled,
        max_unlabeled=args.max_unlabeled,
        augment=args.augment,
        weights=tuple(_numbers(args.weights, "--weights")),
        temperature=args.temperature,
        learning_rate=args.learning_rate,
        batch_size=args.batch_size,
        teacher=args.teacher,
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


COMMANDS = {
    "train": cmd_train,
    "doctor": cmd_doctor,
    "baseline": cmd_baseline,
    "sweep": cmd_sweep,
    "tune": cmd_tune,
    "distill": cmd_distill,
    "report": cmd_report,
    "evaluate": cmd_evaluate,
    "predict": cmd_predict,
    "serve": cmd_serve,
    "export": cmd_export,
    "modules": cmd_modules,
}


CONFIG_FIRST = {"train", "baseline", "sweep", "tune", "evaluate", "distill"}  # read their config before torch


def _run_config_first(run: str) -> None:
    """A run's config.yaml (where the folder is a run) checked before the heavy libraries load."""
    from loracls.config_reader import read_run_config

    if Path(run, "config.yaml").is_file():
        read_run_config(Path(run))
    _quiet_libraries()


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(capped(f"loracls: {exc}"), file=sys.stderr)
        return EXIT_BAD_INPUT
    _progress_bars_on_a_terminal_only()
    try:
        if args.command not in CONFIG_FIRST:
            _quiet_libraries()
        code = COMMANDS[args.command](args)
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
