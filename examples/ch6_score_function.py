"""Book §6.1: the score-function (REINFORCE) estimator against the exact gradient on a small MDP.

The book uses chapter 2's repair MDP (not available here); ``examples/repair_mdp.py`` is our
own 7-state x 4-action repair MDP with exact, differentiable policy evaluation, so the
numbers differ from the book's while the checks are the same: the Monte-Carlo estimate
from 20,000 episodes agrees with autograd's exact gradient (cosine ~1), the environment's
P never enters the differentiated expression, and shifting the returns changes the
surrogate's value arbitrarily but not its expected gradient.

Run: ``.venv/bin/python examples/ch6_score_function.py``
"""
import time

import torch
import torch.nn.functional as F

from repair_mdp import make_repair_mdp, policy_evaluation, sample_repair

torch.set_num_threads(1)
start = time.perf_counter()
P, R = make_repair_mdp()
torch.manual_seed(0)
theta = (0.5 * torch.randn(7, 4, dtype=torch.float64)).requires_grad_()  # policy logits [S, A]
J = policy_evaluation(P, R, torch.softmax(theta, -1), gamma=1.0)[0]
exact = torch.autograd.grad(J, theta)[0]  # [S, A]
n = 20_000
gen = torch.Generator().manual_seed(0)
visits, returns = sample_repair(P, R, torch.softmax(theta, -1).detach(), n, gen)
log_pi = torch.log_softmax(theta, -1)  # [S, A]
surrogate = (returns[:, None, None] * visits * log_pi).sum() / n  # mean of R(tau) * log p(tau)
estimate = torch.autograd.grad(surrogate, theta)[0]
cos = F.cosine_similarity(estimate.flatten(), exact.flatten(), dim=0)
rel = ((estimate - exact).norm() / exact.norm()).item()

print("§6.1 score-function estimator, 20,000 episodes (ours: our 7x4 repair MDP; book: chapter 2's)")
print(f"{'':<26}{'ours':>10}{'book':>10}")
print(f"{'J exact':<26}{J.item():>10.4f}{0.1323:>10.4f}")
print(f"{'mean return':<26}{returns.mean().item():>10.4f}{0.1264:>10.4f}")
print(f"{'relative error':<26}{rel:>10.3f}{0.068:>10.3f}")
print(f"{'cosine to exact':<26}{cos.item():>10.4f}{0.9988:>10.4f}")

print("\nsurrogate value vs gradient under a return shift (a constant baseline)")
book = {0.0: (-0.8342, 0.9988), "-J": (-0.4056, 0.9992), 5.0: (-17.0281, 0.7833)}
print(f"{'shift':<10}{'surrogate':>12}{'cosine':>9} | {'book surrogate':>15}{'book cosine':>12}")
for key, shift in [(0.0, 0.0), ("-J", -J.item()), (5.0, 5.0)]:
    surrogate = ((returns + shift)[:, None, None] * visits * torch.log_softmax(theta, -1)).sum() / n
    grad = torch.autograd.grad(surrogate, theta)[0]
    c = F.cosine_similarity(grad.flatten(), exact.flatten(), dim=0).item()
    print(f"{shift:<+10.3f}{surrogate.item():>12.4f}{c:>9.4f} | {book[key][0]:>15.4f}{book[key][1]:>12.4f}")
print(f"\nwall time {time.perf_counter() - start:.1f} s")
