"""Book §6.3: the estimator on tokens. Only policy tokens get a direct (logit) gradient.

Samples base-agent episodes, takes the REINFORCE surrogate ``-(1/B) sum_n R_n sum_t m_t log pi``
(eq. 6.2, returns as weights, no baseline), and reads gradients off with autograd:

* logits: a position has a *direct* gradient iff it predicts a policy token of a successful
  episode (the policy mask times R != 0); nothing outside the policy mask;
* embeddings: prompt and tool positions still get an *indirect* gradient through attention,
  because later policy tokens read them.

Run: ``python examples/ch6_action_mask.py``
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from agents.rollout.trajectory import collate
from ch6_common import base_agent, sample, set_threads, tok, train_tasks

BOOK_DIRECT = (70, 70, 0)  # positions with a logit gradient, policy tokens of successes, outside the mask
BOOK_EMB = {"prompt": (480, 1.87e-4), "policy": (954, 1.49e-4), "tool": (1149, 3.18e-5)}


def main(argv: list[str] | None = None) -> None:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    set_threads()
    base = base_agent()
    trajs = sample(base, train_tasks, 4, seed=0)  # 80 episodes, in task order
    batch = collate(trajs, tok.pad_id)  # ids [B, T], policy_mask [B, T-1], rewards [B]
    B = batch["ids"].shape[0]
    print(f"{B} base-agent episodes, {int(batch['rewards'].sum())} successful\n")

    embedded = {}

    def keep(module, inputs, output):  # d loss / d token embedding == d loss / d (token + position) embedding
        output.retain_grad()
        embedded["h"] = output

    hook = base.tok_emb.register_forward_hook(keep)
    logits, _ = base(batch["ids"])  # [B, T, V]
    hook.remove()
    logits.retain_grad()
    logp = F.log_softmax(logits[:, :-1], -1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)  # [B, T-1]
    mask, R = batch["policy_mask"], batch["rewards"]
    loss = -(R[:, None] * mask * logp).sum() / B  # eq. (6.2): returns weight each episode's policy tokens
    loss.backward()

    direct = logits.grad[:, :-1].abs().sum(-1) > 0  # [B, T-1] positions with a logit gradient
    n_direct = int(direct.sum())
    n_success_policy = int((mask * R[:, None]).sum())
    outside = int((direct & (mask == 0)).sum()) + int((logits.grad[:, -1].abs().sum(-1) > 0).sum())
    print(f"{'':<44}{'ours':>8}{'book':>8}")
    print(f"{'positions with a direct (logit) gradient':<44}{n_direct:>8}{BOOK_DIRECT[0]:>8}")
    print(f"{'policy tokens of successful episodes':<44}{n_success_policy:>8}{BOOK_DIRECT[1]:>8}")
    print(f"{'direct gradient outside the policy mask':<44}{outside:>8}{BOOK_DIRECT[2]:>8}")
    same = torch.equal(direct, (mask * R[:, None]) != 0)
    print(f"direct-gradient positions == policy mask x (R != 0), position for position: {same}\n")

    owner = batch["owner"]  # [B, T], 0 = pad
    emb_grad = embedded["h"].grad.norm(dim=-1)  # [B, T]
    print(f"{'':<9}{'positions':>10}{'mean |dL/d emb|':>17}   book")
    for name, code in [("prompt", 1), ("policy", 2), ("tool", 3)]:
        rows = owner == code
        n_book, g_book = BOOK_EMB[name]
        print(f"{name:<9}{int(rows.sum()):>10}{float(emb_grad[rows].mean()):>17.2e}   {n_book:>5} {g_book:.2e}")
    tool, policy = (emb_grad[owner == 3].mean(), emb_grad[owner == 2].mean())
    print(f"\ntool / policy embedding-gradient ratio: {float(tool / policy):.2f} (book 0.21): "
          "tool tokens are read through attention, never trained to be produced.")
    print("(Counts differ from the book's: a different batch and tokenizer; the book's batch size is not shown.)")


if __name__ == "__main__":
    main()
