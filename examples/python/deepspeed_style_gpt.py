"""A character-level GPT defined in Python, trained with DeepSpeed's pipeline API on pipetrain.

    pipetrain launch -n 2 -- python3 examples/python/deepspeed_style_gpt.py --steps 200

The script is written as for DeepSpeed (LayerSpec, TiedLayerSpec, PipelineModule, initialize,
train_batch) with `import pipetrain as deepspeed`. Each of the 2 processes builds only its own
stage's layers; the token embedding is tied to the output projection across the two stages.
Rank 0 prints the loss as it falls from ln(vocabulary) and the validation loss at the end.
"""
import argparse
import math
import os
import pathlib

import torch
from torch import nn
import torch.nn.functional as F

import pipetrain as deepspeed  # was: import deepspeed
from pipetrain.pipe import LayerSpec, PipelineModule, TiedLayerSpec  # was: deepspeed.pipe

FORTUNES = pathlib.Path(os.environ.get('PIPETRAIN_FORTUNES_DIR', '/usr/share/games/fortunes'))


def corpus():
    texts = []
    for path in sorted(FORTUNES.iterdir()):
        if path.is_file() and path.suffix not in ('.dat', '.u8'):
            texts.append(path.read_bytes().decode('latin-1'))
    text = ''.join(texts)
    text = text[:400_000]
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    return torch.tensor([index[c] for c in text], dtype=torch.long), vocab


class Embedding(nn.Module):
    def __init__(self, vocab, width):
        super().__init__()
        self.token = nn.Embedding(vocab, width)

    def forward(self, ids):
        return self.token(ids)


class Positions(nn.Module):
    def __init__(self, context, width):
        super().__init__()
        self.position = nn.Parameter(torch.zeros(context, width))
        nn.init.normal_(self.position, std=0.02)

    def forward(self, x):
        return x + self.position[: x.size(1)]


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention and an MLP, both residual."""

    def __init__(self, width, heads):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width)
        self.proj = nn.Linear(width, width)
        self.ln2 = nn.LayerNorm(width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(c // self.heads)
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float('-inf')).softmax(-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, c)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


def logits(embedding, x):
    return x @ embedding.token.weight.t()


def batches(ids, context, rows, seed):
    g = torch.Generator().manual_seed(seed)
    while True:
        start = torch.randint(0, len(ids) - context - 1, (rows,), generator=g)
        window = torch.stack([ids[s:s + context + 1] for s in start.tolist()])
        yield window[:, :-1], window[:, 1:]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--steps', type=int, default=200)
    parser.add_argument('--layers', type=int, default=4)
    parser.add_argument('--width', type=int, default=128)
    parser.add_argument('--context', type=int, default=64)
    parser.add_argument('--schedule', default='1f1b')
    args = parser.parse_args()
    ids, vocab = corpus()
    width, heads = args.width, 4
    layers = [TiedLayerSpec('embed', Embedding, len(vocab), width), LayerSpec(Positions, args.context, width)]
    layers += [LayerSpec(Block, width, heads) for _ in range(args.layers)]
    layers += [LayerSpec(nn.LayerNorm, width), TiedLayerSpec('embed', Embedding, len(vocab), width, forward_fn=logits)]

    def loss_fn(out, targets):
        return F.cross_entropy(out.reshape(-1, len(vocab)), targets.reshape(-1))

    model = PipelineModule(layers=layers, num_stages=2, loss_fn=loss_fn, partition_method='type:Block',
                           seed_layers=True, base_seed=1234)
    config = {
        'train_batch_size': 32, 'train_micro_batch_size_per_gpu': 8, 'gradient_accumulation_steps': 4,
        'steps_per_print': 10**6, 'gradient_clipping': 1.0,
        'optimizer': {'type': 'AdamW', 'params': {'lr': 3e-3, 'betas': [0.9, 0.95], 'weight_decay': 0.01}},
        'scheduler': {'type': 'WarmupLR', 'params': {'warmup_min_lr': 0, 'warmup_max_lr': 3e-3,
                                                       'warmup_num_steps': 20, 'warmup_type': 'linear'}},
        'pipeline': {'schedule': args.schedule},
    }
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    split = int(len(ids) * 0.9)
    train = batches(ids[:split], args.context, 8, seed=1)
    rank0 = engine.global_rank == 0
    if rank0:
        print(f'{len(vocab)} characters, {len(ids)} tokens; stage 0 holds layers {sorted(model.local_layers)}; '
              f'ln(vocabulary) = {math.log(len(vocab)):.3f}', flush=True)
    first = None
    for step in range(1, args.steps + 1):
        loss = engine.train_batch(train).item()
        first = loss if first is None else first
        if rank0 and (step % max(args.steps // 10, 1) == 0 or step == args.steps):
            stats = engine.last_step()
            print(f'step {step}/{args.steps}  loss {loss:.4f}  lr {stats["lr"]:.2e}  '
                  f'{stats["samples_per_s"]:.0f} samples/s', flush=True)
    val = batches(ids[split:], args.context, 8, seed=2)
    val_loss = sum(engine.eval_batch(val).item() for _ in range(4)) / 4
    if rank0:
        print(f'first loss {first:.4f}, last {loss:.4f}, validation loss {val_loss:.4f}', flush=True)


if __name__ == '__main__':
    main()
