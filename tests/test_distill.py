"""`loracls distill`: the student's loss, the teacher's score cache, the unlabeled texts, the whole job on a tiny
finished run (export read back, verdict row, predict and serve side by side) and its refusals."""

import copy
import json
import os
import shutil
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import torch
from huggingface_hub import ModelCard
from transformers import AutoModelForSequenceClassification, BertConfig, BertForSequenceClassification

from conftest import TINY_ENCODER
from loracls import runs
from loracls.baselines.student import StudentFit, StudentSpec, Teaching, keep_layers, layers_kept
from loracls.cli import main
from loracls.config_reader import from_dict
from loracls.data.spec import DataSpec
from loracls.data.splits import left_out_texts, load_dataset
from loracls.hardware import Runtime
from loracls.jobs.distill import TEACHER_CHUNK, _unlabeled, _unlabeled_file, teacher_probabilities
from loracls.problems import problem_for

CPU = Runtime(torch.device("cpu"), torch.float32)


def _config(data, **extra):
    values = {"data": str(data), "train_size": 120, "validation_size": 40, "test_size": 40, "max_length": 32}
    return from_dict({**values, "encoder_model": str(TINY_ENCODER[0]), **extra})


def _fit(config, teaching):
    student = StudentSpec(str(TINY_ENCODER[0]), (teaching.weight,), 1e-3)
    return StudentFit(load_dataset(DataSpec.of(config)), config, CPU, lambda *_: None, student, teaching)


@pytest.mark.parametrize("problem", ["single_label", "multi_label"])
def test_the_student_loss_blends_the_teacher_and_the_gold_labels(data_csv, tmp_path, problem):
    config = _config(data_csv)
    if problem == "multi_label":
        from test_multilabel import label_sets_frame  # a label set a text

        label_sets_frame(300).to_json(tmp_path / "sets.jsonl", orient="records", lines=True)
        config = _config(tmp_path / "sets.jsonl", problem="multi_label")
    dataset = load_dataset(DataSpec.of(config))
    kind, n, labels = dataset.kind, len(dataset.train), len(dataset.id2label)
    rng = np.random.default_rng(0)
    teacher = rng.dirichlet(np.ones(labels), size=n + 2) if problem == "single_label" else rng.random((n + 2, labels))
    teaching = Teaching(
        [*dataset.train.texts, "unlabeled one", "unlabeled two"], teacher, [*dataset.train.labels, None, None]
    )
    rows, logits = [0, n, 1, n + 1], torch.randn(4, labels)
    soft = torch.as_tensor(teacher[rows], dtype=torch.float32)
    gold = kind.targets([dataset.train.labels[0], dataset.train.labels[1]], labels, "cpu")
    to_teacher = kind.loss(logits, soft, None, 4)
    to_gold = kind.loss(logits[[0, 2]], gold, None, 2)  # the unlabeled rows have no gold part
    pure = _fit(config, replace(teaching, weight=1.0)).loss(rows, logits)
    assert torch.allclose(pure, to_teacher)
    blended = _fit(config, replace(teaching, weight=0.25)).loss(rows, logits)
    assert torch.allclose(blended, 0.25 * to_teacher + 0.75 * to_gold)
    if problem == "single_label":  # cross-entropy to soft targets = KL to the teacher + the teacher's entropy
        p = soft
        kl = (p * (p.log() - torch.log_softmax(logits, dim=1))).sum(1).mean()
        assert torch.allclose(to_teacher, kl - (p * p.log()).sum(1).mean(), atol=1e-6)
    # at temperature T: the teacher's logits and the student's divided by T, the soft term scaled by T^2
    hot = Teaching(teaching.texts, teacher, teaching.gold, weight=0.25, temperature=3.0)
    softened = torch.as_tensor(kind.softened(teacher, 3.0)[rows], dtype=torch.float32)
    to_soft = 9.0 * kind.loss(logits / 3.0, softened, None, 4)
    assert torch.allclose(_fit(config, hot).loss(rows, logits), 0.25 * to_soft + 0.75 * to_gold, atol=1e-6)


@pytest.mark.parametrize("problem", ["single_label", "multi_label"])
def test_softened_probabilities_divide_the_teachers_logits(problem):
    kind = problem_for(problem)
    p = np.array([[0.9, 0.1], [0.5, 0.5], [0.2, 0.8]])
    assert np.allclose(kind.softened(p, 1.0), p, atol=1e-6)  # T = 1: unchanged
    soft = kind.softened(p, 2.0)
    assert np.allclose(soft[0], [0.75, 0.25], atol=1e-6)  # odds 9:1 -> 3:1
    assert np.allclose(soft[1], [0.5, 0.5]) and soft[2, 1] == pytest.approx(2 / 3, abs=1e-6)
    assert np.all(np.abs(soft - 0.5) <= np.abs(p - 0.5) + 1e-9)  # never sharper
    sure = kind.softened(np.array([[1.0, 0.0]]), 2.0)  # a probability of exactly 0 or 1 stays finite
    assert np.isfinite(sure).all() and sure[0, 0] > 0.99


class _CountingTeacher:
    """An engine stand-in: probabilities from each text's length; it counts the texts it scored and can fail
    after a number of calls (a killed distill)."""

    labels = ["a", "b"]

    def __init__(self, fail_after: int | None = None):
        self.scored, self.calls, self.fail_after = 0, 0, fail_after

    def probabilities(self, texts):
        if self.fail_after is not None and self.calls >= self.fail_after:
            raise KeyboardInterrupt  # the process is stopped mid-way
        self.calls += 1
        self.scored += len(texts)
        p = np.array([[len(t) % 7 / 7] for t in texts])
        return np.hstack([p, 1 - p])


def test_the_teacher_scores_are_cached_by_text_and_a_killed_call_continues(tmp_path):
    texts = [f"text number {i}" + "!" * (i % 5) for i in range(2 * TEACHER_CHUNK + 10)]
    cache = tmp_path / "teacher_scores"
    killed = _CountingTeacher(fail_after=1)
    with pytest.raises(KeyboardInterrupt):
        teacher_probabilities(killed, texts, cache, lambda *_: None)
    assert killed.scored == TEACHER_CHUNK and len(list(cache.glob("part-*.npz"))) == 1
    resumed, said = _CountingTeacher(), []
    first = teacher_probabilities(resumed, texts, cache, said.append)
    assert resumed.scored == len(texts) - TEACHER_CHUNK  # only the texts not written before
    assert f"({TEACHER_CHUNK} read from" in said[-1]
    again = _CountingTeacher()
    assert np.array_equal(teacher_probabilities(again, texts, cache, said.append), first) and again.scored == 0
    assert np.allclose(first, _CountingTeacher().probabilities(texts))
    # other texts (more unlabeled ones, in another order, a repeat): only the unseen ones are scored
    more = [*texts[::-1], "one more text", "one more text", "and another"]
    wider = _CountingTeacher()
    got = teacher_probabilities(wider, more, cache, said.append)
    assert wider.scored == 2 and np.allclose(got, _CountingTeacher().probabilities(more))
    relabeled = _CountingTeacher()  # another teacher (other labels): the cache starts anew
    relabeled.labels = ["x", "y"]
    teacher_probabilities(relabeled, texts[:3], cache, said.append)
    assert relabeled.scored == 3 and len(list(cache.glob("part-*.npz"))) == 1


def test_unlabeled_texts_come_from_a_file_or_from_what_the_splits_left_out(data_csv, tmp_path):
    def quiet(*_):
        pass

    spec = DataSpec.of(_config(data_csv))
    dataset = load_dataset(spec)
    left = left_out_texts(spec, dataset)
    in_splits = set(dataset.train.texts) | set(dataset.validation.texts) | set(dataset.test.texts)
    assert left and not set(left) & in_splits and len(left) == len(set(left))
    assert _unlabeled_file(None, spec) is None and _unlabeled(None, spec, dataset, quiet) == left
    test_text = dataset.test.texts[0]  # a split's text is not taught: the student would see its test answer
    fresh = ["a new text", "another new text", "a new text"]
    files = {
        "u.csv": "text,other\n" + "".join(f'"{t}",1\n' for t in [*fresh, test_text]),
        "u.jsonl": "".join(json.dumps({"text": t}) + "\n" for t in [*fresh, test_text]),
        "u.txt": "".join(t + "\n" for t in [*fresh, test_text]),
    }
    for name, content in files.items():
        (tmp_path / name).write_text(content)
        assert _unlabeled(_unlabeled_file(str(tmp_path / name), spec), spec, dataset, quiet) == fresh[:2], name
    pd.DataFrame({"text": [*fresh, test_text], "other": 1}).to_parquet(tmp_path / "u.parquet")
    assert _unlabeled(_unlabeled_file(str(tmp_path / "u.parquet"), spec), spec, dataset, quiet) == fresh[:2]


@pytest.fixture(scope="module")
def distilled(trained_runs, tmp_path_factory):
    """A copy of the tiny Gemma 3 run, distilled into the tiny BERT (two teacher weights)."""
    run = tmp_path_factory.mktemp("distill") / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    before = runs.read_metrics(run)
    assert main(["distill", str(run), "--student", str(TINY_ENCODER[0]), "--weights", "0.5,1"]) == 0
    return run, before


def test_distill_writes_a_checked_student_that_joins_the_verdict(distilled):
    run, before = distilled
    record = runs.read_student(run)
    assert set(record.weights) == {"0.5", "1"} and record.teacher_weight in (0.5, 1.0)
    assert record.validation_score == max(record.weights.values())  # the weight chosen on validation
    assert record.unlabeled_texts == len(
        left_out_texts(DataSpec.of(runs.read_config(run)), load_dataset(DataSpec.of(runs.read_config(run))))
    )
    assert record.export is not None and record.export.predictions_equal
    assert record.teacher_texts_per_second > 0 and 0 <= record.agreement_with_teacher <= 1
    rows = {row.name: row for row in runs.read_metrics(run).verdict.rows}
    assert [row.name for row in before.verdict.rows] + ["student"] == list(rows)
    assert rows["student"].accuracy == record.test.accuracy and rows["student"].texts_per_second > 0
    # the cost ratio in the verdict is the one measured side by side in the distill, not two jobs' raw figures
    side_by_side = record.texts_per_second / record.teacher_texts_per_second
    assert rows["student"].texts_per_second / rows["LoRA"].texts_per_second == pytest.approx(side_by_side)
    # read as a user reads it: plain transformers, the temperature already in the head
    model = AutoModelForSequenceClassification.from_pretrained(str(run / runs.STUDENT))
    assert model.config.id2label == {0: "neg", 1: "pos"}
    fmt = json.loads((run / runs.STUDENT / runs.INPUT_FORMAT).read_text())
    assert fmt["input_template"] is None and fmt["decision"]["temperature"] == 1.0
    card = ModelCard.load(run / runs.STUDENT / "README.md")  # its own card, with the verdict's new row
    assert "distillation" in card.data.tags and card.data.eval_results[0].metric_value == round(record.test.accuracy, 4)
    assert "| student |" in card.text and "| student |" in (run / runs.MERGED / "README.md").read_text()


def test_the_student_is_predicted_and_served_beside_its_teacher(distilled, capsys):
    from loracls.inference.group import EngineGroup
    from loracls.inference.loaded import engine_for
    from test_serve_contract import ask

    run, _ = distilled
    capsys.readouterr()
    assert main(["predict", str(run / runs.STUDENT), "--text", "good film", "--text", "bad film"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["text"] for row in rows] == ["good film", "bad film"] and all(row["prediction"] for row in rows)
    original = (run / runs.CONFIG).read_text()
    runs.write_config(run, from_dict({"threads": 1, "eval_batch_size": 7}, base=runs.read_config(run)))
    student = engine_for(str(run / runs.STUDENT), log=print)  # inside a run: the run's settings, as its teacher
    assert student.batch_size == 7 and torch.get_num_threads() == 1
    (run / runs.CONFIG).write_text(original)
    torch.set_num_threads(os.cpu_count() or 1)
    group = EngineGroup([engine_for(str(run), log=lambda *_: None), student])
    names = list(group.served_runs())
    assert names == ["run", "run-student"]

    requests = [("POST", "/classify", {"model": n, "input": ["good film"]}) for n in names]
    *answers, unknown, listed = ask(
        group,
        [*requests, ("POST", "/classify", {"model": "nope", "input": ["good film"]}), ("GET", "/v1/models", None)],
    )
    assert [a.status_code for a in answers] == [200, 200] and unknown.status_code == 404
    assert [a.json()["model"] for a in answers] == names
    assert [m["id"] for m in listed.json()["data"]] == names


def test_a_second_distill_reads_the_teachers_scores(distilled, capsys):
    run, _ = distilled
    assert runs.read_student(run).distill_temperature == 1.0  # the default: the calibrated probabilities
    capsys.readouterr()
    args = ["distill", str(run), "--student", str(TINY_ENCODER[0]), "--weights", "1", "--temperature", "2"]
    assert main(args) == 0
    said = capsys.readouterr().err
    assert "(0 read from" not in said and " read from " in said
    assert "(teacher weight 1, temperature 2)" in said
    assert set(runs.read_student(run).weights) == {"1"} and runs.read_student(run).distill_temperature == 2.0
    assert [row.name for row in runs.read_metrics(run).verdict.rows].count("student") == 1  # replaced, not added


def test_augmented_variants_of_the_training_texts_are_taught_and_counted(distilled, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(distilled[0], run)  # with the teacher's cached scores: only the variants are new to it
    capsys.readouterr()
    assert main(["distill", str(run), "--student", str(TINY_ENCODER[0]), "--weights", "1", "--augment", "2"]) == 0
    said, record = capsys.readouterr().err, runs.read_student(run)
    config = runs.read_config(run)
    dataset = load_dataset(DataSpec.of(config))
    left = left_out_texts(DataSpec.of(config), dataset)
    assert 0 < record.augmented_texts <= 2 * len(dataset.train.texts)
    assert record.unlabeled_texts == len(left) + record.augmented_texts
    assert f"({len(dataset.train.texts) + len(left)} read from" in said  # the variants alone were scored anew
    row = next(row for row in runs.read_metrics(run).verdict.rows if row.name == "student")
    assert f"{record.augmented_texts} of them augmented" in row.detail


def test_a_student_keeps_its_encoders_layers_spread_evenly_and_reloads_as_the_smaller_model(tmp_path):
    assert [layers_kept(6, n) for n in (1, 2, 3, 6)] == [[0], [0, 3], [0, 2, 4], [0, 1, 2, 3, 4, 5]]
    assert layers_kept(12, 6) == [0, 2, 4, 6, 8, 10]  # DistilBERT's one layer of two
    config = BertConfig(vocab_size=64, hidden_size=16, num_hidden_layers=4, num_attention_heads=2, intermediate_size=32)
    whole = BertForSequenceClassification(config).eval()
    student = copy.deepcopy(whole)
    assert keep_layers(student, 2) == [0, 2]
    for mine, theirs in zip(student.bert.encoder.layer, [whole.bert.encoder.layer[0], whole.bert.encoder.layer[2]]):
        assert all(torch.equal(a, b) for a, b in zip(mine.state_dict().values(), theirs.state_dict().values()))
    student.save_pretrained(tmp_path / "student")
    reloaded = AutoModelForSequenceClassification.from_pretrained(str(tmp_path / "student")).eval()
    ids = torch.tensor([[1, 5, 9, 2]])
    assert reloaded.config.num_hidden_layers == 2 and len(reloaded.bert.encoder.layer) == 2
    assert torch.allclose(reloaded(input_ids=ids).logits, student(input_ids=ids).logits, atol=1e-6)
    assert not torch.allclose(reloaded(input_ids=ids).logits, whole(input_ids=ids).logits, atol=1e-6)


def test_distill_into_fewer_layers_exports_the_smaller_student(distilled, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(distilled[0], run)
    student = ["--student", str(TINY_ENCODER[0]), "--student-layers", "1"]
    assert main(["distill", str(run), *student, "--weights", "1"]) == 0
    record = runs.read_student(run)
    assert record.layers == [0] and record.export.predictions_equal
    assert AutoModelForSequenceClassification.from_pretrained(str(run / runs.STUDENT)).config.num_hidden_layers == 1
    whole = runs.read_student(distilled[0])
    assert record.parameters < whole.parameters and whole.layers is None
    row = next(row for row in runs.read_metrics(run).verdict.rows if row.name == "student")
    assert "(layers 0)" in row.detail


def _placed(arg: str, tmp_path) -> str:
    tiny, distilbert = str(TINY_ENCODER[0]), str(tmp_path / "distilbert")
    return arg.replace("{tmp}", str(tmp_path)).replace("{tiny}", tiny).replace("{distilbert}", distilbert)


def _write_tiny_distilbert(directory):
    """An encoder whose layers sit under `transformer.layer` (DistilBERT), not `encoder.layer`."""
    from transformers import AutoTokenizer, DistilBertConfig, DistilBertModel

    config = DistilBertConfig(vocab_size=1000, dim=32, n_layers=2, n_heads=2, hidden_dim=64)
    DistilBertModel(config).save_pretrained(directory)
    AutoTokenizer.from_pretrained(str(TINY_ENCODER[0])).save_pretrained(directory)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--unlabeled", "{tmp}/missing.csv"], "missing.csv"),
        (["--unlabeled", "{tmp}/empty_text.csv"], "empty text"),
        (["--unlabeled", "{tmp}/no_column.csv"], "text"),
        (["--unlabeled", "{tmp}/texts.xlsx"], "unsupported file type"),
        (["--unlabeled", "{tmp}/broken.parquet"], "broken.parquet"),
        (["--max-unlabeled", "-1"], "--max-unlabeled"),
        (["--augment", "-1"], "--augment"),
        (["--augment", "two"], "--augment"),
        (["--weights", "0,1"], "teacher weight"),
        (["--weights", "one"], "--weights"),
        (["--temperature", "0.5"], "--temperature"),
        (["--temperature", "nan"], "--temperature"),
        (["--temperature", "warm"], "--temperature"),
        (["--learning-rate", "-1"], "learning rate"),
        (["--student", "{tmp}/not_an_encoder"], "not_an_encoder"),
        (["--student", "{tiny}", "--student-layers", "3"], "--student-layers must be between 1 and the encoder's 2"),
        (["--student-layers", "0"], "--student-layers"),
        (["--student", "{distilbert}", "--student-layers", "1"], "no encoder.layer stack"),
    ],
)
def test_bad_distill_input_is_one_line_and_writes_nothing(trained_runs, tmp_path, capsys, args, message):
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    (tmp_path / "empty_text.csv").write_text('text\n"fine"\n""\n')
    (tmp_path / "no_column.csv").write_text("words\nhello\n")
    (tmp_path / "not_an_encoder").mkdir()
    (tmp_path / "texts.xlsx").write_bytes(b"PK\x03\x04 not read")
    (tmp_path / "broken.parquet").write_bytes(b"PAR1 cut short")
    _write_tiny_distilbert(tmp_path / "distilbert")
    before = (run / runs.METRICS).read_text()
    capsys.readouterr()
    code = main(["distill", str(run), *[_placed(a, tmp_path) for a in args]])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("loracls: ") and message in err[0], err
    assert not (run / runs.STUDENT).exists() and not (run / runs.STUDENT_RECORD).exists()
    assert not (run / runs.TEACHER_SCORES).exists() and (run / runs.METRICS).read_text() == before


def test_an_unfinished_run_is_not_distilled(trained_runs, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    (run / runs.METRICS).unlink()
    assert main(["distill", str(run)]) == 2
    assert "has not finished" in capsys.readouterr().err


def test_the_students_onnx_export_is_loaded_as_a_user_loads_it(distilled, capsys):
    """`export RUN/student --format onnx`: checked against the student in PyTorch, read back by plain
    onnxruntime + the tokenizer beside it, its card tagged as a distilled model (not a LoRA one)."""
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    import onnxruntime
    from transformers import AutoTokenizer

    run, _ = distilled
    student = run / runs.STUDENT
    capsys.readouterr()
    assert main(["export", str(student), "--format", "onnx"]) == 0
    check = json.loads(capsys.readouterr().out)
    assert check["format"] == "onnx" and check["predictions_equal"] and check["max_probability_difference"] < 1e-3
    assert check["sequence_padded_to"] is None  # BERT's 512-row position table bounds the length, no padding
    folder = student / "onnx"
    texts = ["good film", "bad film", "a long and winding story"]
    tokenizer = AutoTokenizer.from_pretrained(folder)
    encoded = tokenizer(texts, padding=True, return_tensors="np")
    session = onnxruntime.InferenceSession(str(folder / "model.onnx"))
    feeds = {i.name: encoded[i.name].astype(np.int64) for i in session.get_inputs()}
    logits = session.run(None, feeds)[0]
    with torch.no_grad():
        model = AutoModelForSequenceClassification.from_pretrained(student).eval()
        reference = model(**tokenizer(texts, padding=True, return_tensors="pt")).logits.numpy()
    assert np.allclose(logits, reference, atol=1e-3)
    card = ModelCard.load(folder / "README.md")
    assert "distillation" in card.data.tags and "lora" not in card.data.tags


def test_the_students_export_is_checked_in_fp32_not_against_its_autocast_scores(trained_runs, tmp_path, monkeypatch):
    """The export check compares the saved student with the trained one, both in fp32: the in-memory test
    scores (bf16 autocast on a CPU with bf16, where a label near its threshold can flip) are not its reference.
    Here those scores are turned upside down; the export must still be found faithful."""
    import loracls.jobs.distill as distill_job

    real = distill_job.run_student

    def autocast_scores(*args, **kwargs):
        record, fitted = real(*args, **kwargs)
        return record, replace(fitted, test_logits=-fitted.test_logits)

    monkeypatch.setattr(distill_job, "run_student", autocast_scores)
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    assert main(["distill", str(run), "--student", str(TINY_ENCODER[0]), "--weights", "1"]) == 0
    record = runs.read_student(run)
    assert record.export.predictions_equal and record.export.disagreements == 0


def test_the_ensemble_row_can_teach(trained_runs, tmp_path, capsys):
    """--teacher ensemble: the blend's probabilities are taught (cached apart from LoRA's), the student's row says
    so and its cost is put on the ensemble row's scale; a run without an ensemble row refuses it in one line."""
    run = tmp_path / "run"
    shutil.copytree(trained_runs["gemma3"], run)
    args = ["distill", str(run), "--student", str(TINY_ENCODER[0]), "--weights", "1", "--teacher", "ensemble"]
    if not (run / runs.ENSEMBLE).is_file():
        assert main(args) == 2 and "has no ensemble row" in capsys.readouterr().err
        return
    assert main(args) == 0
    record = runs.read_student(run)
    assert record.teacher == "ensemble" and (run / "teacher_scores_ensemble").is_dir()
    rows = {row.name: row for row in runs.read_metrics(run).verdict.rows}
    assert "distilled from the ensemble" in rows["student"].detail
    blend = next(row for name, row in rows.items() if name.startswith("ensemble"))
    side_by_side = record.texts_per_second / record.teacher_texts_per_second
    assert rows["student"].texts_per_second / blend.texts_per_second == pytest.approx(side_by_side)


def test_auto_teaches_the_ensemble_only_where_it_is_the_best_row(tmp_path, monkeypatch):
    from loracls.jobs import distill as module
    from loracls.verdict import LadderRow, decide

    (tmp_path / runs.ENSEMBLE).write_text("{}")
    for ensemble, expected in ((0.90, "ensemble"), (0.85, "lora")):
        rows = [LadderRow("LoRA", 0.85, 0.85), LadderRow("ensemble (LoRA + m)", ensemble, ensemble)]
        verdict = decide(rows, 500)
        monkeypatch.setattr(module.runs, "read_metrics", lambda run, v=verdict: type("M", (), {"verdict": v}))
        assert module.teacher_kind(tmp_path, "auto") == expected  # a tie goes to LoRA
    assert module.teacher_kind(tmp_path, "lora") == "lora"
