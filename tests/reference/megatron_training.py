"""Megatron-LM's training step in float64 PyTorch, shared by the model references
(gpt_reference.py, llama_reference.py): the token-mean cross-entropy, gradient accumulation
over micro-batches, global-norm clipping, Adam with decoupled weight decay and
OptimizerParamScheduler's warmup + cosine schedule counted in samples, and the optimizer's
command-line flags. A model reference supplies its parameters and its loss of a micro-batch.
"""
import math

import torch

TRAIN = {
    "train_iters": 10,
    "global_batch_size": 4,
    "micro_batch_size": 2,
    "num_microbatches": 2,
    "optimizer": "adam",
    "lr": 1e-3,
    "min_lr": 1e-4,
    "lr_decay_style": "cosine",
    "lr_warmup_iters": 2,
    "lr_warmup_init": 0.0,
    "lr_decay_iters": 10,
    "lr_warmup_samples": 8,   # lr_warmup_iters * global_batch_size
    "lr_decay_samples": 40,   # lr_decay_iters * global_batch_size
    "weight_decay": 0.1,
    "weight_decay_incr_style": "constant",
    "adam_beta1": 0.9,
    "adam_beta2": 0.95,
    "adam_eps": 1e-8,
    # Below most pre-clip norms of the GPT reference's run so that clipping triggers (see
    # clipped_iterations in train_config.json); far from every norm so the clip decision is
    # not a rounding question. A model reference with other norms sets its own.
    "clip_grad": 1.5,
}

# What train_config.json records of these semantics.
SEMANTICS = {
    "adam": "t = iteration (1-based; iteration 1 steps the moments with lr 0); "
            "m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; "
            "p -= lr * (m/(1-b1^t) / (sqrt(v/(1-b2^t)) + eps) + wd_mult * weight_decay * p); "
            "wd_mult 0 for biases and 1-D parameters",
    "clip": "g *= clip_grad / (norm + 1e-6) when that is < 1; norm = pre-clip global L2 norm "
            "over all parameters, a tied embedding once",
    "lr_schedule": "lr of iteration i (1-based) is lr_at((i-1) * global_batch_size) by "
                   "megatron/core/optimizer_param_scheduler.py (warmup from lr_warmup_init, then "
                   "cosine to min_lr)",
    "tokens_layout": "expected_train tokens[i, s, :] is sample s of iteration i; micro-batch "
                     "m of iteration i is samples [m*micro_batch_size, (m+1)*micro_batch_size); "
                     "inputs tokens[:-1], labels tokens[1:], positions 0..seq_length-1",
}


def token_mean_loss(logits, labels):
    """Cross-entropy over the full padded vocabulary, mean over all tokens."""
    lse = torch.logsumexp(logits, dim=-1)
    picked = logits.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    return (lse - picked).mean()


def lr_at(num_steps, c):
    """Megatron's OptimizerParamScheduler.get_lr (megatron/core/optimizer_param_scheduler.py), counted in
    samples; num_steps is the scheduler's count before the update."""
    warmup, decay = c["lr_warmup_samples"], c["lr_decay_samples"]
    lr_max, lr_min, init = c["lr"], c["min_lr"], c["lr_warmup_init"]
    if warmup > 0 and num_steps <= warmup:
        return init + (lr_max - init) * num_steps / warmup
    if num_steps > decay:
        return lr_min
    r = (num_steps - warmup) / (decay - warmup)
    return lr_min + (lr_max - lr_min) * 0.5 * (math.cos(math.pi * r) + 1.0)


def decays(name, shape):
    """megatron/core/optimizer/__init__.py: no weight decay for biases and 1-D parameters."""
    return len(shape) > 1 and not name.endswith(".bias")


def train(p, names, c, tokens, micro_batch_loss):
    """Megatron's training loop on the float64 leaf tensors p[name] (updated in place).
    tokens [iters, gbs, T+1]; micro_batch_loss(batch [mbs, T+1] long) -> the token-mean loss.
    Returns per-iteration lm_loss, grad_norm, lr, clipped."""
    exp_avg = {n: torch.zeros_like(p[n]) for n in names}
    exp_avg_sq = {n: torch.zeros_like(p[n]) for n in names}
    b1, b2, eps, wd = c["adam_beta1"], c["adam_beta2"], c["adam_eps"], c["weight_decay"]
    mbs, nmb, gbs = c["micro_batch_size"], c["num_microbatches"], c["global_batch_size"]
    num_steps = 0  # the scheduler's step(0) at construction
    lm_loss, grad_norm, lrs, clipped = [], [], [], []
    for it in range(c["train_iters"]):
        for n in names:
            p[n].grad = None
        losses = []
        for mb in range(nmb):
            batch = torch.tensor(tokens[it, mb * mbs:(mb + 1) * mbs], dtype=torch.long)
            loss = micro_batch_loss(batch)
            (loss / nmb).backward()  # gradient of the mean over micro-batches
            losses.append(loss.item())
        lm_loss.append(sum(losses) / nmb)
        with torch.no_grad():
            norm = math.sqrt(sum(float((p[n].grad ** 2).sum()) for n in names))
            grad_norm.append(norm)
            coef = c["clip_grad"] / (norm + 1e-6)
            clipped.append(coef < 1.0)
            lr = lr_at(num_steps, c)
            lrs.append(lr)
            t = it + 1
            for n in names:
                g = p[n].grad * coef if coef < 1.0 else p[n].grad
                exp_avg[n].mul_(b1).add_((1 - b1) * g)
                exp_avg_sq[n].mul_(b2).add_((1 - b2) * g * g)
                m_hat = exp_avg[n] / (1 - b1 ** t)
                v_hat = exp_avg_sq[n] / (1 - b2 ** t)
                update = m_hat / (v_hat.sqrt() + eps)
                if decays(n, p[n].shape):
                    update = update + wd * p[n]
                p[n].sub_(lr * update)
        num_steps += gbs  # step(increment=global batch) after each successful iteration
    return lm_loss, grad_norm, lrs, clipped


def optimizer_args(c):
    """The `tessera train` / pretrain_gpt flags of the batch, schedule and optimizer of `c`."""
    a = {
        "--micro-batch-size": c["micro_batch_size"], "--global-batch-size": c["global_batch_size"],
        "--train-iters": c["train_iters"], "--optimizer": c["optimizer"], "--lr": c["lr"],
        "--min-lr": c["min_lr"], "--lr-decay-style": c["lr_decay_style"],
        "--lr-warmup-iters": c["lr_warmup_iters"], "--lr-warmup-init": c["lr_warmup_init"],
        "--lr-decay-iters": c["lr_decay_iters"], "--weight-decay": c["weight_decay"],
        "--adam-beta1": c["adam_beta1"], "--adam-beta2": c["adam_beta2"],
        "--adam-eps": c["adam_eps"], "--clip-grad": c["clip_grad"],
    }
    return flags(a)


def flags(a):
    """{"--flag": value} -> ["--flag", "value", ...]."""
    out = []
    for k, v in a.items():
        out += [k, str(v)]
    return out
