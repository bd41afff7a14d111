"""A small exact repair MDP (7 states x 4 actions) for checking gradient estimators (book §6.1, §6.4).

The book's ``arl.make_repair_mdp`` (chapter 2) is not available, so this is our own design
of the same kind: an abstract BugFix episode where the agent can read, edit, test or submit.

States (the last one is terminal)::

    0 unread      nothing known yet                    (every episode starts here)
    1 read        the agent has read the source and knows which op fixes it
    2 broken      the source was edited with a wrong op (the agent does not know)
    3 fixed       the source is fixed (the agent does not know)
    4 known bad   the agent has seen that its edit was wrong (read/test after a wrong edit)
    5 known good  the agent has seen the tests pass
    6 done        absorbing; reached by submit

Actions: 0 read, 1 edit, 2 test, 3 submit. Transitions:

* ``edit`` from an uninformed state (0, 2) picks the right op with probability 0.2 (one of
  five ops); from an informed state (1, 4) with probability 0.9; editing an already fixed
  source (3, 5) breaks it with probability 0.8 (the stacked-edit failure).
* ``read`` / ``test`` move 0->1 (read only; ``test`` on the original source shows nothing
  useful: 0->0), 2->4, 3->5, and leave 1, 4, 5 unchanged.
* ``submit`` ends the episode with reward 1 from a fixed source (3 or 5), else 0.

With gamma = 1 the expected return J is exact by solving ``(I - P_pi) V = r_pi`` over the six
transient states; any softmax policy submits with positive probability, so every episode
ends. ``policy_evaluation`` is differentiable, so autograd gives the exact gradient of J.

Imported by ``ch6_score_function.py`` and ``ch6_baselines.py``. Run on its own, it prints the
exact J of three policies next to the mean return of sampled episodes (a self-check):
``python examples/repair_mdp.py [--episodes N]``.
"""
from __future__ import annotations

import argparse

import torch

READ, EDIT, TEST, SUBMIT = range(4)
STATES = ("unread", "read", "broken", "fixed", "known bad", "known good", "done")


def make_repair_mdp(p_guess: float = 0.2, p_informed: float = 0.9, p_break: float = 0.8,
                    dtype=torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """-> ``P [S, A, S]`` transition probabilities and ``R [S, A]`` expected rewards."""
    S, A = 7, 4
    P = torch.zeros(S, A, S, dtype=dtype)
    R = torch.zeros(S, A, dtype=dtype)
    # read
    for s, nxt in {0: 1, 1: 1, 2: 4, 3: 5, 4: 4, 5: 5}.items():
        P[s, READ, nxt] = 1.0
    # test (on the untouched source the failing tests do not say which op to use)
    for s, nxt in {0: 0, 1: 1, 2: 4, 3: 5, 4: 4, 5: 5}.items():
        P[s, TEST, nxt] = 1.0
    # edit
    P[0, EDIT, 3], P[0, EDIT, 2] = p_guess, 1 - p_guess
    P[2, EDIT, 3], P[2, EDIT, 2] = p_guess, 1 - p_guess
    P[1, EDIT, 3], P[1, EDIT, 2] = p_informed, 1 - p_informed
    P[4, EDIT, 3], P[4, EDIT, 4] = p_informed, 1 - p_informed
    P[3, EDIT, 2], P[3, EDIT, 3] = p_break, 1 - p_break
    P[5, EDIT, 2], P[5, EDIT, 3] = p_break, 1 - p_break
    # submit
    P[:6, SUBMIT, 6] = 1.0
    R[3, SUBMIT] = R[5, SUBMIT] = 1.0
    P[6, :, 6] = 1.0  # done is absorbing, reward 0
    assert torch.allclose(P.sum(-1), torch.ones(S, A, dtype=dtype))
    return P, R


def policy_evaluation(P: torch.Tensor, R: torch.Tensor, policy: torch.Tensor, gamma: float = 1.0) -> torch.Tensor:
    """Exact state values ``V [S]`` of ``policy [S, A]`` (differentiable in ``policy``).

    Solves ``(I - gamma * P_pi) V = r_pi`` on the transient states (all but the last, absorbing one).
    """
    P_pi = torch.einsum("sa,sat->st", policy, P)  # [S, S]
    r_pi = (policy * R).sum(-1)  # [S]
    n = P.shape[0] - 1  # transient states
    eye = torch.eye(n, dtype=P.dtype)
    V = torch.linalg.solve(eye - gamma * P_pi[:n, :n], r_pi[:n])
    return torch.cat([V, torch.zeros(1, dtype=P.dtype)])


def sample_repair(P: torch.Tensor, R: torch.Tensor, policy: torch.Tensor, n: int, generator: torch.Generator,
                  max_steps: int = 50) -> tuple[torch.Tensor, torch.Tensor]:
    """Run n repair-MDP episodes in parallel -> visit counts [n, S, A] and returns [n] (book §6.1)."""
    S, A = R.shape
    state = torch.zeros(n, dtype=torch.long)  # every episode starts 'unread'
    visits = torch.zeros(n, S, A, dtype=P.dtype)
    returns = torch.zeros(n, dtype=P.dtype)
    alive = torch.ones(n, dtype=torch.bool)
    for _ in range(max_steps):
        action = torch.multinomial(policy[state], 1, generator=generator).squeeze(-1)  # [n]
        visits[torch.arange(n), state, action] += alive.to(P.dtype)
        returns += alive * R[state, action]
        probs = P[state, action].clone()  # [n, S]
        probs[~alive] = 0.0
        probs[~alive, -1] = 1.0  # finished episodes stay in 'done'
        state = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        alive &= state != S - 1
    return visits, returns


def deterministic_policy(actions: dict[int, int], dtype=torch.float64) -> torch.Tensor:
    """``{state: action}`` -> policy [S, A] (states not listed: uniform)."""
    policy = torch.full((7, 4), 0.25, dtype=dtype)
    for s, a in actions.items():
        policy[s] = 0.0
        policy[s, a] = 1.0
    return policy


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=20_000, help="Monte-Carlo episodes per policy")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    P, R = make_repair_mdp()
    policies = {
        "uniform": deterministic_policy({}),
        "blind: edit, submit": deterministic_policy({0: EDIT, 2: SUBMIT, 3: SUBMIT}),
        "read, edit, test, submit": deterministic_policy({0: READ, 1: EDIT, 2: TEST, 3: TEST, 4: EDIT, 5: SUBMIT}),
    }
    gen = torch.Generator().manual_seed(0)
    print(f"exact J vs the mean return of {args.episodes:,} sampled episodes")
    print(f"{'policy':<26}{'exact J':>9}{'MC mean':>9}{'std err':>9}")
    for name, policy in policies.items():
        J = policy_evaluation(P, R, policy)[0].item()
        _, returns = sample_repair(P, R, policy, args.episodes, gen)
        se = returns.std().item() / args.episodes ** 0.5
        print(f"{name:<26}{J:>9.4f}{returns.mean().item():>9.4f}{se:>9.4f}")


if __name__ == "__main__":
    main()
