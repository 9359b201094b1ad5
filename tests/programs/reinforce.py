"""REINFORCE on a contextual 3-armed bandit: a softmax policy trained with Categorical.log_prob.

    python tests/programs/reinforce.py [--steps 60] [--batch 32] [--dtype float64]
    USE_MPITENSOR=0 python tests/programs/reinforce.py ...   # the same program on torch

Each step draws a batch of contexts (4 numbers) and, per context, an action from the policy
(a linear layer and a softmax over 3 arms). The actions are drawn by NumPy from the policy's
probabilities, so both libraries take the same actions; arm a pays a mean reward that depends
on the context, plus noise. The loss is the policy-gradient loss
``-(log_prob(action) * (reward - baseline)).mean() - 0.01 * entropy.mean()`` with a running-mean
baseline; Adam. Prints "step N loss X" per step and the mean reward of the last steps.
The initial weights are made by NumPy from a seed, the same under both libraries.
"""
import argparse
import os

import numpy as np

if os.environ.get("USE_MPITENSOR", "1") == "1":
    import mpitensor as torch
    from mpitensor import nn
    from mpitensor.distributions import Categorical
else:
    import torch
    from torch import nn
    from torch.distributions import Categorical

ARMS = 3
CONTEXT = 4


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(CONTEXT, ARMS)

    def forward(self, x):
        return self.head(x)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--dtype", choices=["float32", "float64"], default="float64")
    args = ap.parse_args()
    dtype = getattr(torch, args.dtype)
    torch.set_default_dtype(dtype)
    rng = np.random.default_rng(0)
    policy = Policy()
    with torch.no_grad():  # the same initial weights under both libraries
        policy.head.weight.copy_(torch.tensor(rng.normal(0, 0.3, (ARMS, CONTEXT))))
        policy.head.bias.copy_(torch.tensor(rng.normal(0, 0.3, ARMS)))
    arm_weights = rng.normal(size=(ARMS, CONTEXT))  # mean reward of arm a: x . arm_weights[a]
    opt = torch.optim.Adam(policy.parameters(), lr=0.05)
    baseline = 0.0
    rewards_seen = []
    for step in range(1, args.steps + 1):
        ctx = rng.normal(size=(args.batch, CONTEXT))
        dist = Categorical(logits=policy(torch.tensor(ctx, dtype=dtype)))
        probs = dist.probs.detach().numpy().astype(np.float64)
        u = rng.random(args.batch)
        actions = np.minimum((np.cumsum(probs, axis=1) < u[:, None]).sum(axis=1), ARMS - 1)
        reward = (ctx * arm_weights[actions]).sum(axis=1) + rng.normal(0, 0.1, args.batch)
        advantage = torch.tensor(reward - baseline, dtype=dtype)
        log_prob = dist.log_prob(torch.tensor(actions, dtype=torch.long))
        loss = -(log_prob * advantage).mean() - 0.01 * dist.entropy().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        baseline = 0.9 * baseline + 0.1 * float(reward.mean())
        rewards_seen.append(float(reward.mean()))
        print(f"step {step} loss {loss.item()!r}")
    print(f"mean reward of the last 10 steps {np.mean(rewards_seen[-10:]):.4f} "
          f"(first 10: {np.mean(rewards_seen[:10]):.4f})")


if __name__ == "__main__":
    main()
