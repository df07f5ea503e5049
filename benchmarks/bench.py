"""`python benchmarks/bench.py [CONFIG] [--set K=V] [--steps N] [--repeats N] [--recipes ...] [--full] [--out FILE]`: a
development harness, kept out of the package and using only its public entry points: our train step against (a) the
seed's recipe (padding to max_length, fp32, plain PEFT loop, accumulation as separate passes) and (b) HF Trainer +
PEFT with group_by_length, on the same model, data, seed and precision rules. `hf_trainer_eager` is (b) given
transformers' eager attention by hand (our loop picks eager attention on CPU): it shows how much of the gap over (b)
is that one choice. Each recipe runs in its own process (`bench_recipes`) so peak memory is its own.

Step mode (default) trains `--steps` optimizer steps per recipe on the same examples and reports train tokens/s
(real tokens, padding not counted), seconds per step, peak memory, the ratios, the projected train time of the full
job, and the MFU: the share of the device's peak at the precision trained in (CPU: FMA peak; GPU: its bf16 tensor
peak; FLOPs ~ 4 x non-embedding parameters per trained token). `--repeats N` runs the recipes in N alternating
rounds and keeps each recipe's fastest round (a shared machine's noise only ever slows a run down). `--full` also
runs whole jobs: ours (the real `train`) and (b) as an HF Trainer job with the same splits, validation every
`eval_every` steps, best checkpoint and early stopping, then test accuracy. The seed's whole job (every sequence
padded to max_length, fp32) is projected from its step time: it takes hours on a CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from loracls import runs
from loracls.config import Config
from loracls.config_reader import from_dict
from loracls.errors import LoraclsError
from loracls.hardware import cpu_model_name

RECIPES = ("loracls", "seed", "hf_trainer", "hf_trainer_eager")


def _worker(recipe: str, config: Config, steps: int, log) -> dict:
    """steps > 0: time that many steps of `recipe`; steps == 0: run the HF Trainer job."""
    log(f"bench: {recipe} ({steps} timed steps) ..." if steps else f"bench: {recipe} whole job ...")
    command = [
        sys.executable,
        str(Path(__file__).with_name("bench_recipes.py")),
        recipe,
        str(steps),
        json.dumps(config.to_dict()),
    ]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit code {done.returncode}"
        raise LoraclsError(f"bench worker {recipe} failed: {last}")
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result["process_seconds"] = time.perf_counter() - started
    return result


def run_bench(config: Config, steps: int, recipes: list[str], full: bool, log=print, repeats: int = 1) -> dict:
    from loracls.data.spec import DataSpec
    from loracls.data.splits import load_dataset
    from loracls.training.plan import plan_steps

    rounds = [{recipe: _worker(recipe, config, steps, log) for recipe in recipes} for _ in range(repeats)]
    results = {recipe: max((r[recipe] for r in rounds), key=lambda x: x["tokens_per_second"]) for recipe in recipes}
    for recipe, result in results.items():
        result["tokens_per_second_rounds"] = [r[recipe]["tokens_per_second"] for r in rounds]
    _, total_steps = plan_steps(len(load_dataset(DataSpec.of(config)).train), config)
    for result in results.values():
        result["projected_train_minutes"] = total_steps * result["seconds_per_step"] / 60
    report = {
        "config": {
            k: getattr(config, k)
            for k in ("model", "data", "train_size", "batch_size", "gradient_accumulation", "epochs", "max_length")
        },
        "cpu": cpu_model_name(),
        "threads": torch.get_num_threads(),
        "steps": steps,
        "repeats": repeats,
        "recipes": results,
    }
    ours = results.get("loracls")
    if ours:
        report["ratios"] = {
            f"loracls_vs_{name}": ours["tokens_per_second"] / r["tokens_per_second"]
            for name, r in results.items()
            if name != "loracls"
        }
    if full:
        report["full"] = {"loracls": run_full(config, log)}
        if "hf_trainer" in recipes:
            report["full"]["hf_trainer"] = _worker("hf_trainer", config, 0, log)
            per_step = {name: job["train_seconds"] / max(job["steps"], 1) for name, job in report["full"].items()}
            # per optimizer step (validation included): early stopping may end the two jobs at different steps
            report.setdefault("ratios", {})["whole_job_loracls_vs_hf_trainer"] = (
                per_step["hf_trainer"] / per_step["loracls"]
            )
    return report


def run_full(config: Config, log) -> dict:
    """Our whole job (the real `train`): wall time and test accuracy. The other recipes' full train time is
    projected from their step time (the seed's padded fp32 recipe takes hours on a CPU)."""
    from loracls.jobs.train import train

    started = time.perf_counter()
    run = train(from_dict({"run_name": f"bench-full-{time.strftime('%H%M%S')}"}, base=config), log)
    metrics = runs.read_metrics(Path(run))
    return {
        "recipe": "loracls",
        "train_seconds": metrics.train.seconds,
        "wall_seconds": time.perf_counter() - started,
        "steps": metrics.train.steps,
        "best_validation_accuracy": metrics.validation.best_accuracy,
        "test_accuracy": metrics.test.accuracy,
        "run": str(run),
    }


def format_report(report: dict) -> str:
    rounds = f", fastest of {report['repeats']} rounds" if report.get("repeats", 1) > 1 else ""
    lines = [
        f"bench on {report['cpu']} ({report['threads']} threads), {report['steps']} timed steps per recipe{rounds}",
        f"{'recipe':<16} {'precision':<9} {'attention':<9} {'tokens/s':>9} {'s/step':>7} {'peak MB':>8} {'MFU':>8} "
        f"{'full train (proj.)':>18}",
    ]
    for name, r in report["recipes"].items():
        share = f"{100 * r['mfu']:.1f}%" if r.get("mfu") is not None else "-"
        lines.append(
            f"{name:<16} {r['precision']:<9} {r.get('attention', '-'):<9} {r['tokens_per_second']:>9.1f} "
            f"{r['seconds_per_step']:>7.2f} {r.get('gpu_peak_memory_mb') or r['peak_rss_mb']:>8.0f} {share:>8} "
            f"{r['projected_train_minutes']:>14.1f} min"
        )
    for name, ratio in report.get("ratios", {}).items():
        lines.append(f"{name}: {ratio:.2f}x")
    for name, r in report.get("full", {}).items():
        lines.append(
            f"whole job {name}: train with validation {r['train_seconds'] / 60:.1f} min ({r['steps']} steps), "
            f"all {r['wall_seconds'] / 60:.1f} min; best validation {r['best_validation_accuracy']:.4f}, "
            f"test accuracy {r['test_accuracy']:.4f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """The harness's command line; bad input is one `loracls: ...` line and exit 2, as in the CLI."""
    import argparse

    from loracls import files
    from loracls.config_reader import load_config

    parser = argparse.ArgumentParser(prog="benchmarks/bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("config", nargs="?")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--steps", type=int, default=8, help="timed optimizer steps per recipe (after a warm-up)")
    parser.add_argument("--recipes", default="loracls,seed,hf_trainer", help=f"comma-separated: {', '.join(RECIPES)}")
    parser.add_argument("--repeats", type=int, default=1, help="alternating rounds; each recipe's fastest is kept")
    parser.add_argument("--full", action="store_true", help="also run whole jobs: ours, and HF Trainer's")
    parser.add_argument("--out", help="write the report as JSON here")
    args = parser.parse_args(argv)
    try:
        recipes = [r.strip() for r in args.recipes.split(",") if r.strip()]
        unknown = [r for r in recipes if r not in RECIPES]
        if unknown or not recipes:
            raise LoraclsError(f"bench: unknown recipe(s) {unknown or recipes}; choose from {', '.join(RECIPES)}")
        if args.steps < 1 or args.repeats < 1:
            raise LoraclsError("bench: --steps and --repeats must be >= 1")
        config = load_config(args.config, args.set)
        report = run_bench(config, args.steps, recipes, args.full, lambda m: print(m, file=sys.stderr), args.repeats)
        if args.out:
            files.write_json(Path(args.out), report)
    except LoraclsError as exc:
        print(f"loracls: {exc}", file=sys.stderr)
        return 2
    print(format_report(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
