"""What the chat-template budget and control-token sanitising cost per segment, side by side in one run (.venv-trl).

    python benchmarks/chat_template_budget.py              # 300 alternating rounds
    python benchmarks/chat_template_budget.py --rounds 50

Each round encodes one prompt segment and one tool-output segment of a BugFix episode three ways, in turn:
transformers' own ``apply_chat_template`` as it was called before (three renders: the prompt, and the tool
suffix's dummy conversation with and without the tool message), the same with ``sanitize_control_tokens=True``,
and :class:`~bugfix_gym.integrations.hf_tokenizer.ChatTemplateTokenizer`'s ``segment_ids`` (each render checked
under the budget first, then sanitised; the dummy conversation rendered once and kept).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any, Callable

TEXT = "visible tests : 1 / 2 passed . first failure : clamp(5, 0, 3) expected 3 got 5"


def _ways(make: Callable[[], Any]) -> dict[str, Callable[[], object]]:
    from bugfix_gym.integrations.hf_tokenizer import ChatTemplateTokenizer

    tok = ChatTemplateTokenizer(make())
    hf = tok.hf
    dummy = [{"role": "user", "content": "dummy"}, {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "bugfix", "arguments": {}}}]}]

    def transformers_way(**kw: Any) -> None:
        hf.apply_chat_template([{"role": "user", "content": TEXT}], add_generation_prompt=True, tokenize=True,
                               return_dict=False, **kw)
        hf.apply_chat_template(dummy, tokenize=True, return_dict=False, **kw)
        hf.apply_chat_template(dummy + [{"role": "tool", "name": "bugfix", "content": TEXT}],
                               add_generation_prompt=True, tokenize=True, return_dict=False, **kw)

    return {"transformers, as before": transformers_way,
            "transformers, sanitised": lambda: transformers_way(sanitize_control_tokens=True),
            "segment_ids (budget + sanitised)": lambda: (tok.segment_ids(1, TEXT), tok.segment_ids(3, TEXT))}


def main(argv: list[str] | None = None) -> dict[str, float]:
    from bugfix_gym.integrations.hf_tokenizer import chat_tokenizer, chatml_tokenizer

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=300, help="alternating rounds (default 300)")
    args = parser.parse_args(argv)
    out = {}
    for name, make in (("ChatML", chatml_tokenizer), ("BugFix chat", chat_tokenizer)):
        ways = _ways(make)
        for fn in ways.values():  # warm the caches (compiled templates)
            fn()
        times: dict[str, list[float]] = {way: [] for way in ways}
        for _ in range(args.rounds):
            for way, fn in ways.items():
                start = time.perf_counter()
                fn()
                times[way].append(time.perf_counter() - start)
        base = statistics.median(times["transformers, as before"])
        print(f"{name} template: a prompt and a tool output, ms (median) and / the transformers call as before")
        for way, v in times.items():
            med = statistics.median(v)
            out[f"{name}: {way}"] = med / base
            print(f"  {way:34s} {med * 1e3:8.3f} {med / base:8.2f}")
    print(f"\n{args.rounds} alternating rounds; {os.cpu_count()} CPUs; load average "
          f"{', '.join(f'{x:.1f}' for x in os.getloadavg())}")
    return out


if __name__ == "__main__":
    main()
