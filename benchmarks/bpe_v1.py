"""BugFix-v1's BPE tokenizer: tokens per byte and episode lengths (docs/tinyagent_v1.md, "BPE tokenizer").

Plays the scripted debugger (twelve turns) on one task of each function of the heldout and test splits and
tokenizes each whole transcript as the sampler does (prompt + ``<turn>``, each call + ``<eoc>``, each tool
output + ``<turn>``), with the byte tokenizer, the committed BPE and BPEs of other sizes trained on the same train
text (``--sizes``). The heldout and test text is only measured, never trained on.

    python benchmarks/bpe_v1.py --sizes 512 1024 2048
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from bugfix_gym.contract.bpe_tokenizer import train_bpe
from bugfix_gym.contract.byte_tokenizer import ByteTokenizer
from bugfix_gym.contract.tokens import encode_segment
from bugfix_gym.core.bpe_v1 import load_bpe_v1, split_transcripts, train_texts


def episode_lengths(tok, transcripts) -> list[int]:
    return [sum(len(encode_segment(tok, owner, text)) for owner, text in segments) for segments in transcripts]


def percentile(xs: list[int], q: float) -> int:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, max(0, round(q * (len(xs) - 1))))]


def summary(tok, transcripts) -> dict:
    lengths = episode_lengths(tok, transcripts)
    n_bytes = sum(len(text.encode()) for segments in transcripts for _, text in segments)
    n_tokens = sum(len(tok.encode(text)) for segments in transcripts for _, text in segments)
    calls = [len(tok.encode(text)) for segments in transcripts for owner, text in segments if owner == 2]
    return dict(tokens_per_byte=round(n_tokens / n_bytes, 3), mean=round(statistics.mean(lengths), 1),
                median=statistics.median(lengths), p95=percentile(lengths, 0.95), max=max(lengths),
                mean_call_tokens=round(statistics.mean(calls), 2), max_call_tokens=max(calls))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="*", default=[], help="also train BPEs of these sizes")
    parser.add_argument("--cache", help="a JSON file of the texts (written if missing): skips replaying")
    args = parser.parse_args()
    start = time.time()
    if args.cache and os.path.exists(args.cache):
        with open(args.cache) as f:
            texts = json.load(f)
    else:
        texts = {"train": train_texts(), "heldout": split_transcripts("heldout"), "test": split_transcripts("test")}
        if args.cache:
            with open(args.cache, "w") as f:
                json.dump(texts, f)
    tokenizers = {"byte": ByteTokenizer(), f"bpe_v1 ({load_bpe_v1().vocab_size})": load_bpe_v1()}
    for size in args.sizes:
        tokenizers[f"bpe {size}"] = train_bpe(texts["train"], size)
    for split in ("heldout", "test"):
        for name, tok in tokenizers.items():
            row = dict(split=split, tokenizer=name, episodes=len(texts[split]), **summary(tok, texts[split]))
            print(json.dumps(row))
    print(f"# {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
